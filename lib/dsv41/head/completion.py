"""doit completion: bash completion for `doit` with dsv41's task names (doit's own `tabcompletion`) and
each task's options and arguments, which doit's script does not complete.

    eval "$(doit completion)"            # or: doit completion > ~/.local/share/bash-completion/completions/doit
"""
import subprocess
import sys

from doit.loader import load_tasks

from dsv41.head.core.cluster import log_targets

WRAPPER = r"""
# dsv41: each task's options and arguments (doit's script above completes the task names)
_dsv41_doit() {
    local cur=${COMP_WORDS[COMP_CWORD]} opts=
    if [[ ${COMP_CWORD} -ge 2 ]]; then
        case ${COMP_WORDS[1]} in
%s
        esac
    fi
    if [[ -n $opts ]]; then
        COMPREPLY=( $(compgen -W "$opts" -- "$cur") )
        return 0
    fi
    _doit "$@"
}
complete -o filenames -F _dsv41_doit doit
"""


def task_options(tasks, cfg):
    """{task name: [words]} from doit's loaded tasks: each param's --long and -short flags, and the
    positional choices (logs takes units: one rank per node, memguard, watchdog)."""
    out = {}
    for t in tasks:
        words = []
        for p in t.params:
            words += [f"--{p['long']}"] if p.get("long") else []
            words += [f"-{p['short']}"] if p.get("short") else []
        if t.name == "logs":
            words += log_targets(cfg)
        if words:
            out[t.name] = words
    return out


def script(cfg, dodo):
    """doit's bash completion with the task names written in, and the wrapper adding task options.
    dodo: the loaded dodo module."""
    doit = "import sys; from doit.__main__ import main; sys.argv[0] = 'doit'; main()"   # completes `doit`
    r = subprocess.run([sys.executable, "-c", doit, "tabcompletion", "--shell", "bash", "--hardcode-tasks",
                        "-f", dodo.__file__], capture_output=True, text=True, check=True)
    tasks = load_tasks(vars(dodo))
    cases = "\n".join(f"            {name}) opts=\"{' '.join(words)}\" ;;" for name, words in
                      sorted(task_options(tasks, cfg).items()))
    return r.stdout + WRAPPER % cases


def show(cfg):
    """doit completion."""
    print(script(cfg, sys.modules["dodo"]), end="")
