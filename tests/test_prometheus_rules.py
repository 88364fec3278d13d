"""The prometheus role's files, rendered from its templates for a small inventory and checked by Debian's promtool (the
Makefile unpacks it into the venv): the scrape configuration (`promtool check config`), the alert rules (`promtool
check rules`) and every alert on synthetic series (`promtool test rules` with tests/fixtures/prometheus); and what the
scrape filter makes of an inventory, bad input included."""
import os
import shutil
import subprocess
import sys

import jinja2
import pytest
import siterun
import yaml
from glm5_prometheus import prometheus_duration_problems, prometheus_scrape, prometheus_size_problems
from sglang_fleet import sglang_fleet_workers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLE = os.path.join(ROOT, 'roles', 'prometheus')
FIXTURES = os.path.join(ROOT, 'tests', 'fixtures', 'prometheus')


def defaults(role):
    with open(os.path.join(ROOT, 'roles', role, 'defaults', 'main.yml')) as fh:
        return yaml.safe_load(fh)


def promtool():
    path = shutil.which('promtool') or os.path.join(ROOT, '.venv', 'bin', 'promtool')
    assert os.access(path, os.X_OK), 'promtool is missing: `make venv` unpacks it from Debian\'s prometheus package'
    return path


GROUPS = {'inference_nodes': ['n1', 'n2'], 'gateways': ['gw'], 'pve_hosts': ['pve1'], 'all': []}
HOSTVARS = {
    'n1': {'ansible_host': '10.0.0.1', 'pve_container_pve_host': 'pve1', 'sglang_service_host': '0.0.0.0'},
    'n2': {'ansible_host': '10.0.0.2', 'pve_container_pve_host': 'pve1', 'sglang_service_host': '0.0.0.0',
           'prometheus_engine_min_output_tok_s': 500},
    'gw': {'ansible_host': '10.0.0.9', 'sglang_gateway_metrics_port': 29000, 'sglang_gateway_nodes': ['n1', 'n2']},
    'pve1': {'ansible_host': '10.0.0.5', 'gpu_preflight_gpu_count': 8},
}


def gpu_defaults():
    return dict(defaults('gpu_metrics'), **defaults('gpu_preflight'))


def scrape(groups=GROUPS, hostvars=HOSTVARS, gpu=None):
    workers = sglang_fleet_workers(groups['inference_nodes'], hostvars, defaults('sglang_service'))
    return prometheus_scrape(groups, hostvars, workers, defaults('sglang_smoke'), defaults('sglang_gateway'),
                             gpu_defaults() if gpu is None else gpu)


def render(name, dest, gpu_hosts=None, **extra):
    """A role template rendered for the inventory above (the role's defaults; extra: variables over them)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROLE, 'templates')), trim_blocks=True,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    s = scrape()
    variables = dict(defaults('prometheus'))
    variables.update(ansible_managed='Ansible managed', __prometheus_scrape=s,
                     __prometheus_rules_file=os.path.join(os.path.dirname(dest), 'glm5-alerts.yml'),
                     __prometheus_self='127.0.0.1:9090',
                     __prometheus_gpu_hosts=s['pve_hosts'] if gpu_hosts is None else gpu_hosts)
    variables.update(extra)
    with open(dest, 'w') as fh:
        fh.write(env.get_template(name).render(variables))
    return dest


def run(*argv):
    return subprocess.run([promtool(), *argv], capture_output=True, text=True, timeout=120)


def test_the_scrape_targets_come_from_the_inventory():
    s = scrape()
    assert s['problems'] == []
    assert [(e['node'], e['scheme'], e['target'], e['pve_host']) for e in s['engines']] == [
        ('n1', 'http', '10.0.0.1:30000', 'pve1'), ('n2', 'http', '10.0.0.2:30000', 'pve1')]
    # n1 the smoke test's floor (1,240 output tok/s at 1,024 x tolerance 0.9), n2 its own
    assert [e['min_output_tok_s'] for e in s['engines']] == [1116.0, 500.0]
    # the second smg's metrics (the hand-off's) at the role's default port
    assert s['gateways'] == [{'gateway': 'gw', 'target': '10.0.0.9:29000', 'handoff_target': '10.0.0.9:29001',
                              'nodes': ['n1', 'n2']}]


def test_a_gateway_without_its_metrics_ports_in_the_inventory_is_scraped_at_the_roles_defaults():
    """A production inventory that adds a gateway without setting its metrics ports (the role's defaults serve it):
    Prometheus' check refused it, 'sglang_gateway_metrics_port is not set', where the gateway ran on 29000."""
    hv = dict(HOSTVARS, gw={'ansible_host': '10.0.0.9', 'sglang_gateway_handoff_metrics_port': 9001})
    s = scrape(hostvars=hv)
    assert s['problems'] == [] and s['gateways'] == [{'gateway': 'gw', 'target': '10.0.0.9:29000',
                                                      'handoff_target': '10.0.0.9:9001', 'nodes': ['n1', 'n2']}]
    assert s['pve_hosts'] == [{'host': 'pve1', 'gpus': 8, 'target': '10.0.0.5:9100'}]


def test_a_host_without_the_gpu_metrics_is_neither_scraped_nor_given_a_gpu_threshold():
    hv = dict(HOSTVARS, pve1=dict(HOSTVARS['pve1'], gpu_metrics_enabled=False))
    assert scrape(hostvars=hv)['pve_hosts'] == []
    # the lab's: the PVE host is this machine, reached with a local connection
    hv = dict(HOSTVARS, pve1={'ansible_connection': 'local', 'gpu_metrics_port': 29001})
    assert scrape(hostvars=hv)['pve_hosts'] == [{'host': 'pve1', 'gpus': 8, 'target': '127.0.0.1:29001'}]


def test_a_pve_host_without_its_gpu_metrics_settings_takes_those_roles_defaults():
    """What a PVE host that sets none of them is scraped for comes from gpu_metrics' and gpu_preflight's defaults, as
    those roles deploy it (the filter had its own copies: 9100, 8 GPUs, on)."""
    hv = dict(HOSTVARS, pve1={'ansible_host': '10.0.0.5'})
    assert scrape(hostvars=hv)['pve_hosts'] == [{'host': 'pve1', 'gpus': 8, 'target': '10.0.0.5:9100'}]
    other = {'gpu_metrics_enabled': True, 'gpu_metrics_port': 9400, 'gpu_preflight_gpu_count': 4}
    assert scrape(hostvars=hv, gpu=other)['pve_hosts'] == [{'host': 'pve1', 'gpus': 4, 'target': '10.0.0.5:9400'}]
    assert scrape(hostvars=hv, gpu=dict(other, gpu_metrics_enabled=False))['pve_hosts'] == []


def test_the_floor_follows_the_smoke_tests_speed_factor_and_baseline():
    hv = dict(HOSTVARS, n1=dict(HOSTVARS['n1'], sglang_smoke_speed_factor=8, sglang_smoke_tolerance=0.5,
                                sglang_smoke_baseline={1: {'output_tok_s': 8.2}, 64: {'total_tok_s': 700}}))
    assert scrape(hostvars=hv)['engines'][0]['min_output_tok_s'] == round(8.2 * 0.5 * 8, 3)


@pytest.mark.parametrize('change, problem', [
    ({'n2': {'sglang_gateway_worker_url': 'n2-without-a-port'}}, "n2: its engine URL 'n2-without-a-port' has no"),
    ({'n2': {'prometheus_engine_min_output_tok_s': 0}}, 'n2: prometheus_engine_min_output_tok_s must be > 0'),
    ({'n1': {'sglang_service_host': '127.0.0.1'}}, 'n1: its sglang listens on 127.0.0.1 only (sglang_service_host)'),
])
def test_bad_inventory_is_named(change, problem):
    hv = dict((k, dict(v, **change.get(k, {}))) for k, v in HOSTVARS.items())
    problems = scrape(hostvars=hv)['problems']
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_a_node_missing_from_the_inventory_is_named():
    groups = dict(GROUPS, inference_nodes=['n1', 'ghost'])
    assert scrape(groups=groups)['problems'] == ['ghost is not in the inventory']


def test_durations_prometheus_would_refuse_are_named():
    assert prometheus_duration_problems({'a': '2m', 'b': '1h30m', 'c': '500ms'}) == []
    assert prometheus_duration_problems({'a': '2 minutes', 'b': '', 'c': '5'}) == [
        "a must be a Prometheus duration such as 30s, 2m or 1h30m, got '2 minutes'",
        "b must be a Prometheus duration such as 30s, 2m or 1h30m, got ''",
        "c must be a Prometheus duration such as 30s, 2m or 1h30m, got '5'"]


@pytest.mark.parametrize('size, disk, problem', [
    ('4GB', 8, None), ('512MB', None, None), ('6GiB', 8, None), ('', 8, None), (None, 8, None),
    ('4gb', 8, "prometheus_retention_size must be a Prometheus size such as 512MB or 4GB"),   # Prometheus: unknown unit
    ('4 GB', 8, 'must be a Prometheus size'), ('4', 8, 'must be a Prometheus size'),
    ('0GB', 8, "prometheus_retention_size must be above 0 (\"\" for no cap), got '0GB'"),
    ('7GB', 8, "prometheus_retention_size 7GB leaves less than 2 GiB of the container's 8 GiB disk"),
    ('6145MB', '8', 'leaves less than 2 GiB'),                 # 6 GiB and 1 MiB: 1024 MB to the GB, as Prometheus reads it
])
def test_the_samples_cap_must_be_a_size_prometheus_reads_that_leaves_the_disk_room(size, disk, problem):
    got = prometheus_size_problems(size, disk)
    assert (got == []) if problem is None else (len(got) == 1 and problem in got[0]), got


def test_the_samples_cap_is_on_prometheus_command_line_or_not_at_all(tmp_path):
    for size, flag in (('4GB', ' --storage.tsdb.retention.size=4GB '), ('', None)):
        args = render('prometheus.default.j2', str(tmp_path / 'default'), prometheus_retention_size=size)
        with open(args) as fh:
            line = [x for x in fh if x.startswith('ARGS=')][0]
        assert (flag in line) if flag else ('retention.size' not in line), line


def test_promtool_accepts_the_configuration_and_the_rules(tmp_path):
    rules = render('glm5-alerts.yml.j2', str(tmp_path / 'glm5-alerts.yml'))
    config = render('prometheus.yml.j2', str(tmp_path / 'prometheus.yml'))
    out = run('check', 'rules', rules)
    assert out.returncode == 0, out.stdout + out.stderr
    assert 'SUCCESS: 13 rules found' in out.stdout, out.stdout     # 4 inventory series + 9 alerts
    out = run('check', 'config', config)
    assert out.returncode == 0, out.stdout + out.stderr
    jobs = dict((j['job_name'], j) for j in yaml.safe_load(open(config))['scrape_configs'])
    assert [t['targets'] for t in jobs['glm5-engine']['static_configs']] == [['10.0.0.1:30000'], ['10.0.0.2:30000']]
    assert jobs['glm5-engine']['static_configs'][0]['labels'] == {'node': 'n1', 'pve_host': 'pve1', '__scheme__': 'http'}
    assert jobs['glm5-gateway']['static_configs'] == [{'targets': ['10.0.0.9:29000'], 'labels': {'gateway': 'gw'}}]
    assert jobs['glm5-gateway-handoff']['static_configs'] == [{'targets': ['10.0.0.9:29001'],
                                                              'labels': {'gateway': 'gw'}}]
    assert jobs['glm5-gpu']['static_configs'] == [{'targets': ['10.0.0.5:9100'], 'labels': {'pve_host': 'pve1'}}]


def test_the_alertmanagers_named_are_where_the_alerts_go(tmp_path):
    render('glm5-alerts.yml.j2', str(tmp_path / 'glm5-alerts.yml'))
    config = render('prometheus.yml.j2', str(tmp_path / 'prometheus.yml'),
                    prometheus_alertmanagers=['127.0.0.1:9093', 'am.example.com:9093'])
    out = run('check', 'config', config)
    assert out.returncode == 0, out.stdout + out.stderr
    assert yaml.safe_load(open(config))['alerting'] == {'alertmanagers': [{'static_configs': [
        {'targets': ['127.0.0.1:9093', 'am.example.com:9093']}]}]}
    assert 'alerting' not in yaml.safe_load(open(render('prometheus.yml.j2', str(tmp_path / 'none.yml'))))


def test_an_empty_inventory_still_gives_rules_promtool_accepts(tmp_path):
    empty = {'engines': [], 'gateways': [], 'pve_hosts': [], 'problems': []}
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROLE, 'templates')), trim_blocks=True,
                             undefined=jinja2.StrictUndefined)
    path = tmp_path / 'glm5-alerts.yml'
    path.write_text(env.get_template('glm5-alerts.yml.j2').render(
        dict(defaults('prometheus'), ansible_managed='x', __prometheus_scrape=empty, __prometheus_gpu_hosts=[])))
    out = run('check', 'rules', str(path))
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_fires_when_it_should_and_not_before(tmp_path):
    render('glm5-alerts.yml.j2', str(tmp_path / 'glm5-alerts.yml'))
    shutil.copy(os.path.join(FIXTURES, 'glm5-alerts.test.yml'), tmp_path)
    out = run('test', 'rules', str(tmp_path / 'glm5-alerts.test.yml'))
    assert out.returncode == 0, out.stdout + out.stderr
    alerts = [r['alert'] for g in yaml.safe_load(open(tmp_path / 'glm5-alerts.yml'))['groups'] for r in g['rules']
              if 'alert' in r]
    tested = open(tmp_path / 'glm5-alerts.test.yml').read()
    assert [a for a in alerts if 'alertname: ' + a not in tested] == [], 'an alert without a promtool test'


def test_the_gpu_alerts_stay_silent_without_gpu_thresholds(tmp_path):
    """No host with GPU metrics (__prometheus_gpu_hosts empty): the GPU alerts have no threshold series, so the
    GPU-missing test must fail - the thresholds are what make it fire."""
    render('glm5-alerts.yml.j2', str(tmp_path / 'glm5-alerts.yml'), gpu_hosts=[])
    shutil.copy(os.path.join(FIXTURES, 'glm5-alerts.test.yml'), tmp_path)
    out = run('test', 'rules', str(tmp_path / 'glm5-alerts.test.yml'))
    assert out.returncode == 1 and 'GLM5GPUMissing' in out.stdout + out.stderr, out.stdout + out.stderr


CHECK_INVENTORY = {'all': {'children': {
    'inference_nodes': {'hosts': {'n1': {'ansible_host': '10.0.0.1', 'sglang_service_host': '0.0.0.0'}}},
    'gateways': {'hosts': {'gw': {'ansible_host': '10.0.0.9', 'sglang_gateway_metrics_port': 29000}}},
    'monitoring': {'hosts': {'prom': {'ansible_host': '10.0.0.7'}}}}}}
CHECK_PLAY = [{'hosts': 'monitoring', 'gather_facts': False, 'tasks': [
    {'ansible.builtin.include_role': {'name': 'prometheus', 'tasks_from': 'validate.yml'}}]}]


@pytest.fixture(scope='module')
def check(tmp_path_factory):
    """The role's checks as site.yml's first plays run them (read-only, no host contacted), with extra variables."""
    return siterun.local_checks(tmp_path_factory.mktemp('prometheus-check'), CHECK_INVENTORY, CHECK_PLAY)


@pytest.mark.parametrize('extra, words', [
    ({}, None),
    ({'prometheus_alert_down_for': '2 minutes'},
     "prometheus_alert_down_for must be a Prometheus duration such as 30s, 2m or 1h30m, got '2 minutes'"),
    ({'sglang_service_host': '127.0.0.1'},
     'n1: its sglang listens on 127.0.0.1 only (sglang_service_host) and Prometheus scrapes it at 10.0.0.1:30000'),
    ({'prometheus_alert_power_draw_ratio': 1.5},
     'prometheus_alert_power_draw_ratio and prometheus_alert_power_busy_ratio must be in (0, 1]'),
])
def test_bad_settings_are_refused_before_anything_changes(check, extra, words):
    siterun.refused_saying(*check(**extra), 'prom', words)


def test_the_fleets_page_is_a_go_template_after_ansibles_jinja(tmp_path):
    """templates/glm5.html.j2 holds Prometheus' Go template inside a Jinja raw block: what the role writes begins with a
    Go comment and keeps every Go action for Prometheus to render (tests/test_prometheus_stack.py renders it there)."""
    page = open(render('glm5.html.j2', str(tmp_path / 'glm5.html'))).read()
    assert page.startswith('{{/* Ansible managed: ') and '{% raw %}' not in page and '{% endraw %}' not in page
    assert page.count('{{ range query ') == 3 and page.count('{{ end }}') > 20
    assert page.count('{{') == page.count('}}')


def test_a_gateway_and_a_pve_host_at_ipv6_addresses_are_scraped_in_brackets():
    hv = dict(HOSTVARS, gw=dict(HOSTVARS['gw'], ansible_host='fd00::9'), pve1=dict(HOSTVARS['pve1'], ansible_host='fd00::5'))
    s = scrape(hostvars=hv)
    assert (s['gateways'][0]['target'], s['gateways'][0]['handoff_target']) == ('[fd00::9]:29000', '[fd00::9]:29001')
    assert s['pve_hosts'][0]['target'] == '[fd00::5]:9100'


def test_a_samples_cap_the_container_cannot_hold_stops_site_yml_before_any_host_is_touched():
    """site.yml on the lab inventory (not contacted: its monitoring settings play is read-only and runs first)."""
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               PATH=bindir + os.pathsep + os.environ['PATH'])
    r = subprocess.run([os.path.join(bindir, 'ansible-playbook'), 'site.yml', '--check', '-e',
                        'prometheus_retention_size=7GB'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = ' '.join(r.stdout.split())
    assert r.returncode != 0 and "prometheus_retention_size 7GB leaves less than 2 GiB of the container's 8 GiB disk" \
        in out, out[-3000:]
    recap = r.stdout[r.stdout.index('PLAY RECAP'):]
    assert 'glm5-prom' in recap and 'pve-lab' not in recap, recap     # no play reached the PVE host
