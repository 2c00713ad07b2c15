"""What a call may do: tool policy, shell analysis, approvals, redaction.

tool_policy.py     per-tool rules: executables, file roots, caps (``Policy``)
shell_analysis.py  the programs a shell command runs (tree-sitter-bash)
command_rules.py   what a program's arguments make of it (interpreters, wrappers, ...)
approvals.py       the approval queue (high-risk commands, egress ``ask``)
egress_grants.py   standing egress decisions (sandbox / always)
redaction.py       known secret values and detect-secrets patterns out of tool output
principal.py       who is calling (operator or a session token)
"""
