"""doit completion: bash completion for `doit` in this checkout: doit's commands and dsv41's task names
(never the internal `_` ones), each task's options and arguments (`doit logs` the units, `doit config`
the settings the schema declares). Plain bash, no bash-completion package needed.

    eval "$(doit completion)"            # or: doit completion > ~/.local/share/bash-completion/completions/doit
"""
import sys

from doit.doit_cmd import DoitMain
from doit.loader import load_tasks

from dsv41.head.core.cluster import log_targets

SCRIPT = r"""# bash completion for doit in a dsv41 checkout (doit completion)
_dsv41_doit() {
    local cur=${COMP_WORDS[COMP_CWORD]} words=
    if [[ ${COMP_CWORD} -le 1 ]]; then
        words="%(first)s"
    else
        case ${COMP_WORDS[1]} in
            help|info|forget|ignore|clean) words="%(tasks)s" ;;
%(cases)s
        esac
    fi
    COMPREPLY=( $(compgen -W "$words" -- "$cur") )
}
complete -o default -F _dsv41_doit doit
"""


def task_options(tasks, cfg):
    """{task name: [words]} from doit's loaded tasks: each param's --long and -short flags, and the
    positional words (logs: one rank per node, memguard, watchdog; config: the settings)."""
    out = {}
    for t in tasks:
        if t.name.startswith("_"):
            continue
        words = []
        for p in t.params:
            words += [f"--{p['long']}"] if p.get("long") else []
            words += [f"-{p['short']}"] if p.get("short") else []
        if t.name == "logs":
            words += log_targets(cfg)
        if t.name == "config":
            words += list(cfg.values) + [f"r{s.rank}.{k}" for s in cfg.nodes for k in (
                "target", "model_dir", "ip", "ifname", "hcas", "gid_index")]
        if words:
            out[t.name] = words
    return out


def script(cfg, dodo):
    """The completion script for the tasks of the loaded dodo module."""
    tasks = load_tasks(vars(dodo))
    names = sorted(t.name for t in tasks if not t.name.startswith("_") and ":" not in t.name)
    commands = [c.get_name() for c in DoitMain.DOIT_CMDS if c.get_name() != "tabcompletion"]
    cases = "\n".join(f"            {name}) words=\"{' '.join(words)}\" ;;" for name, words in
                      sorted(task_options(tasks, cfg).items()))
    return SCRIPT % {"first": " ".join(commands + names), "tasks": " ".join(names), "cases": cases}


def show(cfg):
    """doit completion."""
    print(script(cfg, sys.modules["dodo"]), end="")
