"""The lab PVE's credentials, made once under <state>/pve: the root@pam password, and a lab CA with the server
certificate the front (https://127.0.0.1:8006) and fakepve present."""
from __future__ import annotations

import datetime
import os
import secrets

from glm5_lab.paths import HOST, NODE, write_private


def ensure_secrets(p):
    """root@pam password and a lab CA with a server certificate for 127.0.0.1, made once."""
    os.makedirs(p['pve'], mode=0o700, exist_ok=True)
    if not os.path.exists(p['password']):
        write_private(p['password'], secrets.token_urlsafe(24).encode())
    if os.path.exists(p['cert']) and os.path.exists(p['ca']):
        return
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, 'GLM-5 lab PVE CA')])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE)])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=825))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName('localhost'), x509.DNSName(NODE),
                                                        x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    nokey = serialization.NoEncryption()
    fmt = serialization.PrivateFormat.TraditionalOpenSSL
    write_private(p['ca_key'], ca_key.private_bytes(pem, fmt, nokey))
    write_private(p['key'], key.private_bytes(pem, fmt, nokey))
    with open(p['ca'], 'wb') as out:
        out.write(ca.public_bytes(pem))
    with open(p['cert'], 'wb') as out:
        out.write(cert.public_bytes(pem))
