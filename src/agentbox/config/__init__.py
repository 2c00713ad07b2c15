"""Every settings model, imported downward only (nothing here imports a front end).

host.py      where state lives ($AGENTBOX_HOME), admission limits
specs.py     sandbox specifications (what ``create`` validates)
settings.py  the gateway's YAML file (auth, audit, tools, models, telemetry, ...)
"""
