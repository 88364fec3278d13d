"""Filters for the SGLang roles: profile checks, the effective patch set, and flags as an argv.

A profile (roles/sglang_env/profiles/<name>/profile.yml) is data; these filters decide what it means:

- sglang_profile_problems(profile, name, profile_dir, patch_overrides): one line per problem, [] when usable
  (its lock there, and the wheel sizes of every pin in it: wheel-sizes.json);
- sglang_profile_patches(profile, patch_overrides): the patches with `enabled` after the inventory's overrides;
- sglang_flags(profile_flags, overrides): the profile's flags with the inventory's single-flag overrides
  (a value of None / null removes a flag);
- sglang_argv(flags): the flags as sglang's command line, in the profile's order (`true` is a bare switch,
  `false` leaves it out, a list repeats values after one option).
"""
import json
import os
import re

REQUIRED = {'name': str, 'description': str, 'sglang': str, 'python': str, 'cuda': str, 'resolved_as_of': str,
            'requirements': list, 'lock': str, 'patches': list, 'flags': dict, 'env': dict}
PATCH_REQUIRED = {'name': str, 'file': str, 'target': str, 'sha256': str, 'sha256_patched': str, 'enabled': bool,
                  'validated_on_hardware': bool, 'why': str}
SHA256 = re.compile(r'[0-9a-f]{64}')
FLAG = re.compile(r'[a-z0-9][a-z0-9-]*')
ENV = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
PIN = re.compile(r'^([A-Za-z0-9][A-Za-z0-9_.-]*)==(\S+)', re.M)
# Beside each profile's lock: the disk each pinned wheel takes unpacked in uv's cache, in bytes (scripts/lock_profiles.py
# --sizes-from measures them in a cache the lock was installed from). sglang_env's room check for the wheel cache adds
# up the largest of them, as many as uv says it would download.
WHEEL_SIZES = 'wheel-sizes.json'


def lock_pins(text):
    """The `name==version` pins of a hashed lock (uv pip compile's output), in its order."""
    return ['{0}=={1}'.format(n, v) for n, v in PIN.findall(text)]


def first_few(items, n=3):
    """The first n of items, joined, with ', ...' where there are more (a long list named in one line)."""
    items = list(items)
    return ', '.join(items[:n]) + (', ...' if len(items) > n else '')


def wheel_sizes_problems(where, profile_dir, lock):
    """The profile's wheel-sizes.json must give a size (bytes, an integer > 0) for every pin of its lock."""
    path = os.path.join(profile_dir, WHEEL_SIZES)
    try:
        with open(path) as fh:
            sizes = json.load(fh).get('sizes')
    except (OSError, ValueError, AttributeError) as exc:
        return ['{0}: {1} cannot be read ({2}): scripts/lock_profiles.py --sizes-from <uv cache> {3} writes it'.format(
            where, WHEEL_SIZES, str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            os.path.basename(profile_dir))]
    if not isinstance(sizes, dict):
        return ['{0}: {1} has no "sizes" mapping'.format(where, WHEEL_SIZES)]
    with open(os.path.join(profile_dir, lock)) as fh:
        pins = lock_pins(fh.read())
    missing = [p for p in pins if p not in sizes]
    bad = sorted(k for k, v in sizes.items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0)
    out = []
    if missing:
        out.append('{0}: {1} has no size for {2} of its lock ({3}): the lock changed since it was measured; '
                   'scripts/lock_profiles.py --sizes-from <uv cache> {4} measures them again'.format(
                       where, WHEEL_SIZES, len(missing), first_few(missing), os.path.basename(profile_dir)))
    if bad:
        out.append('{0}: {1}: sizes are bytes, integers above 0; not {2}'.format(where, WHEEL_SIZES, first_few(bad)))
    return out


def _scalar(value):
    return isinstance(value, (str, int, float, bool))


def flag_value_problems(where, flags):
    out = []
    if not isinstance(flags, dict):
        return ['{0} must be a mapping of flag name (without --) to value'.format(where)]
    for key, value in flags.items():
        if not isinstance(key, str) or not FLAG.fullmatch(key):
            out.append('{0}: {1!r} is not a flag name (lower-case words joined by -, without the leading --)'.format(
                where, key))
        elif value is not None and not _scalar(value) and not (
                isinstance(value, list) and value and all(_scalar(v) and not isinstance(v, bool) for v in value)):
            out.append('{0}: {1}: a flag value is a string, number, true/false, or a non-empty list of values; '
                       'got {2!r}'.format(where, key, value))
    return out


def sglang_flag_problems(overrides, where='sglang_service_flag_overrides', reserved=()):
    """Problems of the inventory's single-flag overrides: kinds of values, and flags the inventory sets elsewhere."""
    out = flag_value_problems(where, overrides)
    if isinstance(overrides, dict):
        owned = sorted(k for k in overrides if k in reserved)
        if owned:
            out.append('{0}: {1} set by their own variables (sglang_service_model_path, _served_model_name, _host, '
                       '_port, _api_key), not as flag overrides'.format(where, ', '.join(owned)))
    return out


def sglang_profile_problems(profile, name, profile_dir, patch_overrides=None):
    where = 'SGLang profile {0!r}'.format(name)
    if not isinstance(profile, dict):
        return ['{0}: profile.yml is not a mapping'.format(where)]
    out = []
    for key, kind in REQUIRED.items():
        if key not in profile:
            out.append('{0}: {1} is missing'.format(where, key))
        elif not isinstance(profile[key], kind):
            out.append('{0}: {1} must be a {2}, got {3!r}'.format(where, key, kind.__name__, profile[key]))
    if out:
        return out
    if profile['name'] != name:
        out.append('{0}: its name is {1!r}; the directory and the name must agree'.format(where, profile['name']))
    if not re.fullmatch(r'3\.\d+', profile['python']):
        out.append('{0}: python must be major.minor such as "3.11", got {1!r}'.format(where, profile['python']))
    if not re.fullmatch(r'\d{4}-\d{2}-\d{2}', profile['resolved_as_of']):
        out.append('{0}: resolved_as_of must be a date YYYY-MM-DD, got {1!r}'.format(where, profile['resolved_as_of']))
    if 'sglang=={0}'.format(profile['sglang']) not in profile['requirements']:
        out.append('{0}: requirements must pin sglang=={1}'.format(where, profile['sglang']))
    if not os.path.isfile(os.path.join(profile_dir, profile['lock'])):
        out.append('{0}: lock {1} not found (scripts/lock_profiles.py writes it)'.format(where, profile['lock']))
    else:
        out.extend(wheel_sizes_problems(where, profile_dir, profile['lock']))
    names = []
    for i, patch in enumerate(profile['patches']):
        pwhere = '{0}: patches[{1}]'.format(where, i)
        if not isinstance(patch, dict):
            out.append('{0} is not a mapping'.format(pwhere))
            continue
        bad = [k for k, kind in PATCH_REQUIRED.items() if not isinstance(patch.get(k), kind)]
        if bad:
            out.append('{0}: {1} missing or of the wrong type (need {2})'.format(
                pwhere, ', '.join(bad), ', '.join('{0}: {1}'.format(k, PATCH_REQUIRED[k].__name__) for k in bad)))
            continue
        names.append(patch['name'])
        for key in ('sha256', 'sha256_patched'):
            if not SHA256.fullmatch(patch[key]):
                out.append('{0} ({1}): {2} is not a sha256 (64 lower-case hex digits)'.format(pwhere, patch['name'], key))
        if not os.path.isfile(os.path.join(profile_dir, patch['file'])):
            out.append('{0} ({1}): {2} not found in the profile'.format(pwhere, patch['name'], patch['file']))
        if patch['target'].startswith('/') or '..' in patch['target'].split('/'):
            out.append('{0} ({1}): target must be a path inside site-packages, got {2!r}'.format(
                pwhere, patch['name'], patch['target']))
    if len(set(names)) != len(names):
        out.append('{0}: patch names must be unique'.format(where))
    unknown = sorted(set(patch_overrides or {}) - set(names))
    if unknown:
        out.append('sglang_env_patches names {0} which profile {1!r} does not have (it has: {2})'.format(
            ', '.join(unknown), name, ', '.join(names) or 'no patches'))
    for key, value in (patch_overrides or {}).items():
        if not isinstance(value, bool):
            out.append('sglang_env_patches: {0} must be true or false, got {1!r}'.format(key, value))
    out.extend(flag_value_problems('{0}: flags'.format(where), profile['flags']))
    for key, value in profile['env'].items():
        if not isinstance(key, str) or not ENV.fullmatch(key):
            out.append('{0}: env: {1!r} is not a variable name'.format(where, key))
        elif not isinstance(value, str):
            out.append('{0}: env: {1} must be a string (quote it), got {2!r}'.format(where, key, value))
    return out


def sglang_profile_patches(profile, patch_overrides=None):
    overrides = patch_overrides or {}
    out = []
    for patch in profile.get('patches', []):
        patch = dict(patch)
        patch['enabled'] = bool(overrides.get(patch['name'], patch['enabled']))
        out.append(patch)
    return out


def sglang_flags(profile_flags, overrides=None):
    flags = dict(profile_flags or {})
    for key, value in (overrides or {}).items():
        if value is None:
            flags.pop(key, None)
        else:
            flags[key] = value
    return flags


def sglang_argv(flags):
    argv = []
    for key, value in (flags or {}).items():
        if value is None or value is False:
            continue
        if value is True:
            argv.append('--' + key)
        elif isinstance(value, list):
            argv.append('--' + key)
            argv.extend(str(v) for v in value)
        else:
            argv.extend(['--' + key, str(value)])
    return argv


class FilterModule(object):
    def filters(self):
        return {
            'sglang_profile_problems': sglang_profile_problems,
            'sglang_flag_problems': sglang_flag_problems,
            'sglang_profile_patches': sglang_profile_patches,
            'sglang_flags': sglang_flags,
            'sglang_argv': sglang_argv,
        }
