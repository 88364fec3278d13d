"""glm5 bench's progress: a bar per concurrency level, following the run's folder in the bench history."""
from __future__ import annotations

import re
import shlex
import time

TQDM = re.compile(r'(\d+)/(\d+) \[')


class Progress(object):
    """A bar per level from bench_serving's own progress bar in the level's log (the run folder)."""
    def __init__(self, node, levels, prompts, out, run):
        self.node, self.levels, self.prompts, self.out = node, levels, prompts, out
        self.run, self.started, self.done, self.tty = run, False, set(), out.isatty()
        self.t0, self.level_t0 = time.monotonic(), {}

    def _count(self, level):
        # the last 'done/total [' of tqdm's bar in the log (the bar's own characters are not UTF-8 safe to cut)
        log = shlex.quote(self.node.history_path(self.run, 'bench-c{0}.log'.format(level)))
        r = self.node.pve_host.run('test -e {0} && {{ LC_ALL=C tr -cd "0-9/[ \\r\\n" < {0} | tr "\\r" "\\n" | '
                                   'grep -o "[0-9]*/[0-9]* \\[" | tail -n 1; }}'.format(log))
        if not r.ok:
            return None
        found = TQDM.findall(r.stdout)
        return (int(found[-1][0]), int(found[-1][1])) if found else (0, self.prompts[level])

    def _bar(self, level, count, final=False):
        total = self.prompts[level]
        done = count[0] if count else 0
        width = 30
        fill = int(width * done / total) if total else 0
        secs = time.monotonic() - self.level_t0.get(level, self.t0)
        return 'concurrency {0:>5} [{1}{2}] {3:>6}/{4:<6} {5:>5.0f} s{6}'.format(
            level, '#' * fill, '.' * (width - fill), done, total, secs,
            '' if not final or done == total else '  (incomplete)')

    def poll(self, finished=False):
        if not self.started:              # its folder not there yet: it may wait for the engine's lock
            self.started = self.run in self.node.run_folders()
            if not self.started:
                return
        counts = {}
        for lv in self.levels:          # the levels run in order: one that has not started, nor have the later ones
            if lv in self.done:
                continue
            count = self._count(lv)
            if count is None:
                break
            counts[lv] = count
        started = list(counts)
        for n, lv in enumerate(started):
            self.level_t0.setdefault(lv, time.monotonic())
            if finished or n < len(started) - 1:
                self.done.add(lv)
                self.out.write(('\r' if self.tty else '') + self._bar(lv, counts[lv], final=True) + '\n')
            elif self.tty:
                self.out.write('\r' + self._bar(lv, counts[lv]))
            self.out.flush()
