"""sglang_service's launcher (roles/sglang_service/files/glm5-sglang-launch): the engine gets --api-key=<key> from
SGLANG_API_KEY, as `python -m MODULE` or `python SCRIPT` would run it, and the key is on no process's command line
nor in the environment of what the engine starts (a multiprocessing 'spawn' child, as sglang starts its scheduler and
detokenizer). Run here with a stand-in module that reports what it sees; the emulator's tests start the lab engine
(sglang's own parser) through it too. With SGLANG_API_KEY_SECONDARY, the pinned sglang's own auth middleware lets
either key in (the launcher wraps its decision function), and nothing else."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
from sglang_envs import NAMES, environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, 'roles', 'sglang_service', 'files', 'glm5-sglang-launch')
KEY = '-k3y-Secret_0123456789abcdefghijklmnopqrstuv'

# What the engine sees, and what a child it spawns sees; printed as JSON.
ENGINE = textwrap.dedent('''
    import json, multiprocessing, os, sys

    def report():
        with open('/proc/self/cmdline', 'rb') as fh:
            cmdline = fh.read().decode()
        with open('/proc/self/environ', 'rb') as fh:
            environ = fh.read().decode()
        return {'cmdline': cmdline, 'environ': environ, 'getenv': os.environ.get('SGLANG_API_KEY')}

    def child(queue):
        queue.put(report())

    if __name__ == '__main__':
        ctx = multiprocessing.get_context('spawn')
        queue = ctx.Queue()
        p = ctx.Process(target=child, args=(queue,))
        p.start()
        spawned = queue.get(timeout=60)
        p.join(60)
        print(json.dumps(dict(report(), argv=sys.argv, name=__name__, path0=sys.path[0],
                              spec=getattr(__spec__, 'name', None), child=spawned)))
''')


@pytest.fixture
def engine_files(tmp_path):
    (tmp_path / 'toy_engine.py').write_text(ENGINE)
    return tmp_path


def launch(args, cwd, key=KEY):
    env = dict(os.environ, PYTHONPATH='')
    env.pop('SGLANG_API_KEY', None)
    if key is not None:
        env['SGLANG_API_KEY'] = key
    return subprocess.run([sys.executable, LAUNCHER] + args, cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=120)


def check_hidden(out):
    for seen in (out, out['child']):
        assert KEY not in seen['cmdline'] and '--api-key' not in seen['cmdline'], seen['cmdline']
    # the engine's own environment as it began (what /proc shows root and its own user) held it; not any more for
    # its code, and its children never get it
    assert out['getenv'] is None
    assert 'SGLANG_API_KEY' not in out['child']['environ'] and out['child']['getenv'] is None


def test_a_module_is_run_as_python_dash_m_with_the_key_added(engine_files):
    p = launch(['-m', 'toy_engine', '--port', '8000', '--model-path', '/m'], engine_files)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    # the key whole, as one token (it begins with '-'), after the engine's own arguments
    assert out['argv'][0] == str(engine_files / 'toy_engine.py')
    assert out['argv'][1:] == ['--port', '8000', '--model-path', '/m', '--api-key=' + KEY]
    assert out['name'] == '__main__' and out['spec'] == 'toy_engine' and out['path0'] == str(engine_files)
    assert out['cmdline'].split('\0')[1:4] == [LAUNCHER, '-m', 'toy_engine']
    check_hidden(out)


def test_a_script_is_run_as_python_script(engine_files, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp('cwd')
    script = str(engine_files / 'toy_engine.py')
    p = launch([script, '--port', '8000'], elsewhere)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out['argv'] == [script, '--port', '8000', '--api-key=' + KEY]
    assert out['name'] == '__main__' and out['path0'] == str(engine_files)
    check_hidden(out)


@pytest.mark.parametrize('key', [None, ''])
def test_no_key_no_engine(engine_files, key):
    p = launch(['-m', 'toy_engine'], engine_files, key=key)
    assert p.returncode == 2 and p.stdout == ''
    assert 'SGLANG_API_KEY is not set or empty: the engine would serve without an API key; refused' in p.stderr


@pytest.mark.parametrize('args', [[], ['-m'], ['--port', '1']])
def test_no_engine_named_is_a_usage_line(engine_files, args):
    p = launch(args, engine_files)
    assert p.returncode == 2 and 'usage: glm5-sglang-launch (-m MODULE | SCRIPT)' in p.stderr, p.stderr


SECONDARY = 'old-K3y_0123456789abcdefghijklmnopqrstuvwx'

# sglang's own auth middleware (sglang.srt.utils.auth.add_api_key_middleware, as its http_server adds it) on a FastAPI
# app with one normal endpoint and a health endpoint, the key from the --api-key the launcher added; each status printed.
SERVER = textwrap.dedent('''
    import json, sys
    from fastapi import FastAPI
    from starlette.testclient import TestClient
    from sglang.srt.utils.auth import add_api_key_middleware
    app = FastAPI()

    @app.get('/v1/models')
    def models():
        return {'data': []}

    @app.get('/health')
    def health():
        return {}

    key = [a for a in sys.argv if a.startswith('--api-key=')][0].split('=', 1)[1]
    add_api_key_middleware(app, api_key=key, admin_api_key=None)
    client = TestClient(app)
    out = {}
    for name, header in (('key', 'Bearer ' + key), ('secondary', 'Bearer ' + sys.argv[1]), ('other', 'Bearer nope'),
                         ('none', None), ('secondary-raw', sys.argv[1])):
        headers = {'Authorization': header} if header else {}
        out[name] = [client.get('/v1/models', headers=headers).status_code,
                     client.get('/health', headers=headers).status_code]
    out['environ'] = sorted(k for k in __import__('os').environ if k.startswith('SGLANG_API_KEY'))
    print(json.dumps(out))
''')


@pytest.mark.sglang
@pytest.mark.parametrize('profile', NAMES)
def test_a_secondary_key_is_let_in_by_sglangs_own_middleware_beside_the_key(tmp_path, profile):
    (tmp_path / 'server.py').write_text(SERVER)
    python = os.path.join(environment(profile)[1], 'bin', 'python')
    runs = {}
    for secondary in (SECONDARY, None):
        env = dict(os.environ, PYTHONPATH='', SGLANG_API_KEY=KEY)
        env.pop('SGLANG_API_KEY_SECONDARY', None)
        if secondary:
            env['SGLANG_API_KEY_SECONDARY'] = secondary
        p = subprocess.run([python, LAUNCHER, str(tmp_path / 'server.py'), SECONDARY], cwd=str(tmp_path), env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        runs[secondary] = json.loads(p.stdout.strip().splitlines()[-1])
    # neither key is left in the engine's environment (what it starts would inherit it)
    assert runs[SECONDARY].pop('environ') == runs[None].pop('environ') == [], runs
    # with it: the key and the secondary key in, anything else refused; health open to all, as before
    assert runs[SECONDARY] == {'key': [200, 200], 'secondary': [200, 200], 'other': [401, 200], 'none': [401, 200],
                              'secondary-raw': [401, 200]}, runs
    # without it (the same middleware): the secondary key is refused like any other
    assert runs[None] == {'key': [200, 200], 'secondary': [401, 200], 'other': [401, 200], 'none': [401, 200],
                          'secondary-raw': [401, 200]}, runs


def test_a_secondary_key_without_sglangs_decision_function_stops_the_engine(engine_files):
    # this venv has no sglang: the second key cannot be taken, and the engine does not start without it
    env = dict(os.environ, PYTHONPATH='', SGLANG_API_KEY=KEY, SGLANG_API_KEY_SECONDARY=SECONDARY)
    p = subprocess.run([sys.executable, LAUNCHER, '-m', 'toy_engine'], cwd=str(engine_files), env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == '', p.stdout
    assert ('SGLANG_API_KEY_SECONDARY is set but this sglang cannot take a second key: no sglang/srt/utils/auth.py in '
            'this environment (sglang not found); refused') in p.stderr, p.stderr
    assert SECONDARY not in p.stderr and KEY not in p.stderr
