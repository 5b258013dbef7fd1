"""The vLLM serving recipe (recipe), its rank containers' argv and environment (argv), its own
settings (settings), and the alert rules and dashboard panels of its series (rules.yml.j2,
panels.json). Only this package names vLLM's flags and series."""
