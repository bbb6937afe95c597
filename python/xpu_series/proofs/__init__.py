"""Each patch proven: fails without, passes with, and its mutants killed."""

# The environment of every test run a proof makes (the caller's, plus these):
# - nothing the runs import (the tree, the servers they start) writes bytecode
#   into the tree;
# - pytest loads no plugin that is merely installed (anyio and hypothesis here,
#   by their entry points); a project names the ones its tests need (`-p` in its
#   pytest settings, which the record's key covers). So an outcome depends on
#   what the key names, not on what else an environment holds, and no worker
#   pays for plugins no test uses (0.2 s per interpreter, about 45 s of CPU of
#   the proof tool's own tests in CI, measured).
TEST_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
