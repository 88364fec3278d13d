#!/usr/bin/env python3
"""Lab stand-in for NVIDIA's .run driver installer (NVIDIA-Linux-x86_64-<version>.run): no GPU, no download.

The lab packs this file, scripts/lab/nvidia_smi.py and the constructed 8-GPU fixture into
NVIDIA-Linux-x86_64-<version>.run (ansible/playbooks/lab_gpu_driver.yml), a shell archive run as
`sh NVIDIA-Linux-x86_64-<version>.run <flags>` like the real one; the version comes from the file name.

What it checks, as the real installer does: only options it knows (else "Unrecognized option"); no
interactive run (it needs --silent / -s here, the way automation runs the real one); a kernel module build
(no --no-kernel-module) needs the running kernel's headers (/lib/modules/$(uname -r)/build), and Blackwell
needs the open flavour (-m=kernel-open or --kernel-module-type=open); --dkms only with a kernel module.
What it does: installs the userspace stand-ins (libnvidia-ml.so.<version> marker, nvidia-smi printing the
fixture with this version, nvidia-modprobe and nvidia-persistenced that only record that they ran, and
nvidia-uninstall that removes all of it), replacing
another version first, as the real one uninstalls an older driver. With a kernel module and --dkms it puts
a dkms.conf in /usr/src/nvidia-<version> and registers it with the real `dkms add` (no module is built:
there is no GPU and no kernel source here); --kernel-name=<k> picks the kernel whose headers it checks.
Every run is appended to /var/log/nvidia-installer.log (the real installer's log).
"""
import datetime
import os
import re
import shutil
import sys

KNOWN = {'--silent', '-s', '--no-kernel-module', '--dkms', '--no-dkms', '-m=kernel-open', '-m=kernel',
         '--kernel-module-type=open', '--kernel-module-type=proprietary', '--no-questions', '-q', '--ui=none',
         '--accept-license', '-a', '--no-nouveau-check', '--no-drm', '--no-systemd', '--install-libglvnd',
         '--no-install-libglvnd', '--no-x-check', '--disable-nouveau'}
KNOWN_PREFIXES = ('--kernel-name=',)
LIBDIR = '/usr/lib/x86_64-linux-gnu'
SHARE = '/usr/lib/glm5-lab-nvidia'   # the stand-in nvidia-smi, its fixture and version
LOG = '/var/log/nvidia-installer.log'


def log(lines):
    with open(LOG, 'a') as out:
        out.write('nvidia-installer log file (lab stand-in), {0}\n'.format(datetime.datetime.now().isoformat()))
        for line in lines:
            out.write(line + '\n')


def fail(msg, argv):
    log(['command line: ' + ' '.join(argv), 'ERROR: ' + msg])
    print('ERROR: ' + msg, file=sys.stderr)
    return 1


def installed_version():
    for name in sorted(os.listdir(LIBDIR)) if os.path.isdir(LIBDIR) else []:
        m = re.fullmatch(r'libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)', name)
        if m:
            return m.group(1)
    return None


# nvidia-modprobe and nvidia-persistenced of the stand-in: they record each run (time, arguments) in
# /run/glm5-lab-nvidia/<tool>.log; nvidia-persistenced forks a sleeping child, as the daemon forks.
RECORDER = """#!/bin/sh
# lab stand-in for NVIDIA's {tool} {version}: records that it ran; there is no GPU here
mkdir -p /run/glm5-lab-nvidia
echo "$(date +%s.%N) {tool} $*" >> /run/glm5-lab-nvidia/{tool}.log
if [ {tool} = nvidia-persistenced ]; then
  sleep infinity </dev/null >/dev/null 2>&1 &
fi
exit 0
"""

# nvidia-uninstall of the stand-in, as the real installer leaves one: removes what the installer put in place.
UNINSTALL = """#!/bin/sh
# lab stand-in for NVIDIA's nvidia-uninstall {version}: removes what the stand-in installer installed
set -e
if command -v dkms >/dev/null && dkms status -m nvidia -v {version} | grep -q .; then
  dkms remove -m nvidia -v {version} --all
fi
rm -rf /usr/src/nvidia-{version} {share}
rm -f {libdir}/libnvidia-ml.so.{version} {libdir}/libnvidia-ml.so.1 /usr/bin/nvidia-smi \\
  /usr/bin/nvidia-modprobe /usr/bin/nvidia-persistenced /usr/bin/nvidia-uninstall
echo "nvidia-uninstall: removed the NVIDIA driver {version}" | tee -a {log}
"""

DKMS_CONF = """PACKAGE_NAME="nvidia"
PACKAGE_VERSION="{version}"
# lab stand-in: registered with DKMS, never built (no kernel source, no GPU)
BUILT_MODULE_NAME[0]="nvidia"
DEST_MODULE_LOCATION[0]="/kernel/drivers/video"
AUTOINSTALL="yes"
"""


def dkms_register(version):
    """Put the module source where the real installer does and `dkms add` it; drop other versions first."""
    import subprocess
    status = subprocess.run(['dkms', 'status', '-m', 'nvidia'], capture_output=True, text=True).stdout
    for old in sorted(set(re.findall(r'^nvidia/([\d.]+)', status, re.M)) - {version}):
        subprocess.run(['dkms', 'remove', '-m', 'nvidia', '-v', old, '--all'], capture_output=True, text=True)
        shutil.rmtree('/usr/src/nvidia-' + old, ignore_errors=True)
    if re.search(r'^nvidia/{0}\b'.format(re.escape(version)), status, re.M):
        return None
    src = '/usr/src/nvidia-' + version
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, 'dkms.conf'), 'w') as out:
        out.write(DKMS_CONF.format(version=version))
    r = subprocess.run(['dkms', 'add', '-m', 'nvidia', '-v', version], capture_output=True, text=True)
    if r.returncode != 0:
        return 'dkms add nvidia/{0} failed: {1}'.format(version, (r.stderr or r.stdout).strip())
    return None


def main(argv, version, payload):
    if not re.fullmatch(r'\d+\.\d+(\.\d+)?', version or ''):
        return fail('cannot tell the driver version from the installer name', argv)
    unknown = [a for a in argv if a not in KNOWN and not a.startswith(KNOWN_PREFIXES)]
    if unknown:
        return fail('Unrecognized option: "{0}"; run with --help for usage information'.format(unknown[0]), argv)
    if not {'--silent', '-s'} & set(argv):
        return fail('interactive installation is not supported here: run with --silent', argv)
    userspace_only = '--no-kernel-module' in argv
    if userspace_only and '--dkms' in argv:
        return fail('--dkms registers a kernel module with DKMS, but --no-kernel-module installs none', argv)
    done = ['command line: ' + ' '.join(argv)]
    if not userspace_only:
        kernel = next((a.split('=', 1)[1] for a in argv if a.startswith('--kernel-name=')), os.uname().release)
        build = '/lib/modules/{0}/build'.format(kernel)
        if not os.path.isdir(build):
            return fail('Unable to find the kernel source tree for the kernel {0}. Please make sure you have installed '
                        'the kernel source files for your kernel ({1})'.format(kernel, build), argv)
        if not {'-m=kernel-open', '--kernel-module-type=open'} & set(argv):
            return fail('The NVIDIA GPUs in this system are supported only by the open kernel modules: '
                        'use -m=kernel-open', argv)
        if '--dkms' in argv:
            if not shutil.which('dkms'):
                return fail('Failed to run `dkms --version`: install dkms to register the kernel module with it', argv)
            err = dkms_register(version)
            if err:
                return fail(err, argv)
            done.append('registered the open kernel module nvidia/{0} with DKMS for {1}'.format(version, kernel))
        else:
            done.append('would build the open kernel module {0} for {1}'.format(version, kernel))
    old = installed_version()
    if old and old != version:
        os.unlink(os.path.join(LIBDIR, 'libnvidia-ml.so.' + old))
        done.append('uninstalled the existing driver {0}'.format(old))
    os.makedirs(LIBDIR, exist_ok=True)
    with open(os.path.join(LIBDIR, 'libnvidia-ml.so.' + version), 'w') as out:
        out.write('lab stand-in for NVIDIA NVML {0} (no code)\n'.format(version))
    link = os.path.join(LIBDIR, 'libnvidia-ml.so.1')
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink('libnvidia-ml.so.' + version, link)
    shutil.rmtree(SHARE, ignore_errors=True)
    shutil.copytree(payload, SHARE)
    with open(os.path.join(SHARE, 'version'), 'w') as out:
        out.write(version + '\n')
    os.chmod(os.path.join(SHARE, 'nvidia-smi'), 0o755)
    if os.path.lexists('/usr/bin/nvidia-smi'):
        os.unlink('/usr/bin/nvidia-smi')
    os.symlink(os.path.join(SHARE, 'nvidia-smi'), '/usr/bin/nvidia-smi')
    for tool in ('nvidia-modprobe', 'nvidia-persistenced'):
        with open(os.path.join('/usr/bin', tool), 'w') as out:
            out.write(RECORDER.format(tool=tool, version=version))
        os.chmod(os.path.join('/usr/bin', tool), 0o755)
    with open('/usr/bin/nvidia-uninstall', 'w') as out:
        out.write(UNINSTALL.format(version=version, share=SHARE, libdir=LIBDIR, log=LOG))
    os.chmod('/usr/bin/nvidia-uninstall', 0o755)
    done.append('installed the NVIDIA userspace {0}: {1}, /usr/bin/nvidia-smi, nvidia-modprobe, '
                'nvidia-persistenced, nvidia-uninstall'.format(version, os.path.join(LIBDIR, 'libnvidia-ml.so.' + version)))
    log(done)
    print('\n'.join(done[1:]))
    return 0


if __name__ == '__main__':
    # argv[1]: the .run file's name (its version), argv[2]: the unpacked payload, then the installer's options
    if len(sys.argv) < 3:
        sys.exit('usage: nvidia_installer.py RUN_FILE_NAME PAYLOAD_DIR [OPTIONS...] (the stand-in .run calls it so)')
    name, payload = sys.argv[1], sys.argv[2]
    m = re.search(r'NVIDIA-Linux-x86_64-([\d.]+)\.run$', name)
    sys.exit(main(sys.argv[3:], m.group(1) if m else None, payload))
