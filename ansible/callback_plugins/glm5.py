# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = """
    name: glm5
    type: stdout
    short_description: Ansible's default output, less the whole argument spec when a role's input is refused
    description:
        - Ansible's own default callback (ansible.builtin.default), with two differences. When a role's
          meta/argument_specs.yml refuses an input, the failed validation result carries the role's whole spec
          (argument_spec_data, ~100 lines for sglang_smoke) after the one line that says what is wrong; this
          callback leaves the spec out, so the refusal is the error line and argument_errors.
        - A task that asks again until its condition holds (until and retries, as a service becoming ready, a
          node leaving the gateway or requests draining) says "waiting" at each try, not "FAILED - RETRYING" -
          nothing has failed until its tries run out, which the task's own failure then says.
    extends_documentation_fragment:
      - default_callback
      - result_format_callback
    requirements:
      - set as stdout_callback (ansible.cfg does)
"""

# (after DOCUMENTATION, as Ansible's own)
from ansible.plugins.callback.default import CallbackModule as DefaultCallback  # noqa: E402

from ansible import constants as C  # noqa: E402

VALIDATION = ('validate_argument_spec', 'ansible.builtin.validate_argument_spec',
              'ansible.legacy.validate_argument_spec')
LEFT_OUT = ('argument_spec_data', 'validate_args_context')


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'stdout'
    CALLBACK_NAME = 'glm5'

    def _clean_results(self, result, task_name):
        super()._clean_results(result, task_name)
        if task_name in VALIDATION:
            for key in LEFT_OUT:
                result.pop(key, None)

    def v2_runner_retry(self, result):
        left = result.result['retries'] - result.result['attempts']
        msg = 'waiting: [{0}]: {1} ({2} {3} left)'.format(self.host_label(result), result.task_name or result.task, left,
                                                          'try' if left == 1 else 'tries')
        if self._run_is_verbose(result, verbosity=2):
            msg += ' Result was: %s' % self._dump_results(result.result)
        self._display.display(msg, color=C.COLOR_DEBUG)
