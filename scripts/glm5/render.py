"""What glm5 prints: numbers, times and tables as text, the per-GPU table, the status screen."""
from __future__ import annotations

import datetime
import urllib.parse


def iso(epoch):
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime('%Y-%m-%d %H:%M:%S UTC')


def ago(seconds):
    if seconds is None:
        return '?'
    seconds = int(seconds)
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return ' '.join(x for x in ('{0}d'.format(d) if d else '', '{0}h'.format(h) if h or d else '',
                                '{0}m'.format(m) if not d else '', '{0}s'.format(s) if not (d or h) else '') if x)


def num(value, digits=1):
    if value is None:
        return '-'
    if isinstance(value, float):
        return '{0:,.{1}f}'.format(value, digits)
    return '{0:,}'.format(value) if isinstance(value, int) else str(value)


def gpu_table(gpus):
    rows = [('GPU', 'name', 'util %', 'power W / limit', 'memory MiB', 'temp C', 'SM MHz')]
    for g in gpus or []:
        rows.append((str(g['index']), (g.get('name') or '').replace('NVIDIA ', ''), num(g.get('utilization_gpu_pct'), 0),
                     '{0} / {1}'.format(num(g.get('power_draw_w')), num(g.get('power_limit_w'), 0)),
                     '{0} / {1}'.format(num(g.get('memory_used_mib'), 0), num(g.get('memory_total_mib'), 0)),
                     num(g.get('temperature_c'), 0), num(g.get('clocks_sm_mhz'), 0)))
    return table(rows)


def table(rows, right=None):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, r in enumerate(rows):
        out.append('  '.join((str(v).ljust(w) if i == 0 or (right is not None and i not in right) else str(v).rjust(w))
                             if n else str(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True))).rstrip())
    return '\n'.join(out)


def status_text(st):
    lines = ['{0}: {1}'.format(st['node'], 'HEALTHY' if not st['problems'] else 'UNHEALTHY')]
    c = st['container']
    lines.append('  container   ' + ('CT {0} on {1}: {2}{3}'.format(c['vmid'], c['node'], c['status'],
                                                                    ', up ' + ago(c['uptime_s'])
                                                                    if c['status'] == 'running' else '')
                                     if not c.get('error') else 'unknown (' + c['error'] + ')'))
    u = st.get('unit')
    if u:
        lines.append('  unit        {0} {1} ({2}){3}, {4} restarts'.format(
            u['name'], u['active'], u['sub'], ' since {0}, up {1}'.format(u['since'], ago(u['uptime_s']))
            if u['since'] else '', u['restarts']))
    h = st.get('health')
    if h:
        lines.append('  health      {0} {1}{2}'.format(
            urllib.parse.urlsplit(h['url']).path, h.get('status') or h.get('detail'),
            ' in {0} s'.format(h['seconds']) if h.get('seconds') is not None else ''))
    s = st.get('sglang')
    if s:
        lines.append('  sglang      {0}, profile {1}, flags {2}, {3} as {4}'.format(
            s['version'], s['profile'], s['flags_sha256'][:12], s['url'], s['served_model_name']))
        lines.append('  patches     ' + (', '.join('{0} ({1})'.format(p['name'], p['state']) for p in s['patches'])
                                         or 'none'))
    d = st.get('drivers') or {}
    hk, cu = d.get('host_kernel_module') or {}, d.get('container_userspace')
    lines.append('  driver      host kernel module {0}{1} | container userspace {2}'.format(
        hk.get('version') or '?', ' (open)' if hk.get('open') else '',
        '{0} (CUDA {1})'.format(cu['version'], cu['cuda']) if cu and cu.get('version') else '?'))
    last = st.get('last_smoke')
    if last and not last.get('error'):
        lines.append('  last smoke  {0} {1}{2}{3}'.format(
            last['run'], 'PASSED' if last['passed'] else 'FAILED',
            ', {0} total tok/s ({1} output) at concurrency {2}'.format(
                num(last['headline_total_tok_s']), num(last['headline_output_tok_s']), last['headline_concurrency'])
            if last.get('headline_total_tok_s') is not None else '',
            (' (rolled back)' if last.get('rolled_back') else '') +
            (' (another flag set than the running one)' if last.get('other_flags') else '')))
    if st.get('gpus'):
        lines.append('')
        lines.extend('  ' + x for x in gpu_table(st['gpus']).splitlines())
    for p in st['problems']:
        lines.append('  PROBLEM: ' + p)
    return '\n'.join(lines)

