"""The gateway policy engine: command analysis (evasions), lists, approvals, files, diffs."""

from __future__ import annotations

import pytest

from agentbox.errors import InvalidRequest
from agentbox.policy.shell_analysis import MAX_COMMAND_CHARS, MAX_DEPTH
from agentbox.policy.tool_policy import (
    CommandPolicy,
    Decision,
    FilePolicy,
    UnparseableCommand,
    diff_summary,
    programs_in,
)

ALLOW = ["bash", "git", "make", "curl", "python3", "pip", "pytest", "node", "npm", "ls", "cat"]
ALLOW += ["echo", "grep"]
DENY = ["rm", "shutdown", "mkfs", "iptables"]
APPROVAL = ["rm -rf *", "git push --force*", "* | sh"]

POLICY = CommandPolicy(ALLOW, DENY, APPROVAL)
DENY_RM = "tools.terminal.run.deny: rm"
NOT_ALLOWED = "tools.terminal.run.allow"

# (command, expected rule) - every one of these must be denied.
EVASIONS: list[tuple[str, str]] = [
    ("ls; rm -rf /", DENY_RM),
    ("ls && rm x", DENY_RM),
    ("ls || rm x", DENY_RM),
    ("ls & rm x", DENY_RM),
    ("ls | xargs rm", DENY_RM),
    ("ls |& rm x", DENY_RM),
    ("! rm x", DENY_RM),
    ("$(rm x)", DENY_RM),
    ("`rm x`", DENY_RM),
    ("echo $(echo $(rm x))", DENY_RM),
    ("echo `echo \\`rm x\\``", DENY_RM),  # nested backticks: re-parsed after unescaping
    ('echo "$(rm x)"', DENY_RM),
    ("(rm x)", DENY_RM),
    ("{ rm x; }", DENY_RM),
    ("env FOO=1 rm x", DENY_RM),
    ("env -i rm x", DENY_RM),
    ("env -u HOME -- rm x", DENY_RM),
    ("env -S 'rm -rf' /", DENY_RM),
    ("FOO=1 rm x", DENY_RM),
    ("/usr/bin/rm x", DENY_RM),
    ("/proc/self/root/usr/bin/rm x", DENY_RM),
    ("./rm", DENY_RM),
    ("~/bin/rm x", DENY_RM),
    ("r''m x", DENY_RM),
    ('"rm" x', DENY_RM),
    ("\\rm x", DENY_RM),
    ("r\\\nm x", DENY_RM),
    ("bash -c 'rm x'", DENY_RM),
    ('sh -c "echo; rm x"', DENY_RM),
    ("bash -c \"bash -c 'rm x'\"", DENY_RM),
    ("bash -ec 'rm x'", DENY_RM),
    ("bash -o pipefail -c 'rm x'", DENY_RM),
    ("busybox sh -c 'rm x'", DENY_RM),
    ("nice -n 5 rm x", DENY_RM),
    ("nice -5 rm x", DENY_RM),
    ("nohup rm x &", DENY_RM),
    ("setsid -f rm x", DENY_RM),
    ("timeout 5 rm x", DENY_RM),
    ("timeout -s KILL -k 1 5 rm x", DENY_RM),
    ("stdbuf -oL rm x", DENY_RM),
    ("\\time -p rm x", DENY_RM),
    ("command -p rm x", DENY_RM),
    ("exec rm x", DENY_RM),
    ("builtin eval 'rm x'", DENY_RM),
    ("sudo -u root rm x", DENY_RM),
    ("doas rm x", DENY_RM),
    ("chroot / rm x", DENY_RM),
    ("busybox rm x", DENY_RM),
    ("xargs -n 1 -P 4 rm < list", DENY_RM),
    ("find . -exec rm {} \\;", DENY_RM),
    ("find . -name '*.o' -execdir rm {} +", DENY_RM),
    ("find . -ok rm {} \\;", DENY_RM),
    ("watch -n 1 'rm x'", DENY_RM),
    ("runuser -u bob -- rm x", DENY_RM),
    ("su -c 'rm x' bob", DENY_RM),
    ("su -lc 'rm x' bob", DENY_RM),
    ("su -c'rm x'", DENY_RM),
    ("su -s /bin/sh -c 'rm x'", DENY_RM),
    ("su --session-command='rm x'", DENY_RM),
    ("script -qc 'rm x' /dev/null", DENY_RM),
    ("flock -xc 'rm x' /tmp/l", DENY_RM),
    ("bash <<'EOF'\nrm x\nEOF", DENY_RM),
    ("sh -s <<EOF\nls\nrm x\nEOF", DENY_RM),
    ("bash <<< 'rm x'", DENY_RM),
    ("sudo bash <<'EOF'\nrm x\nEOF", DENY_RM),
    ("env sh <<< 'rm x'", DENY_RM),
    ("bash -c 'sh' <<'EOF'\nrm x\nEOF", DENY_RM),
    ("'r''m' x", DENY_RM),  # quote removal is bash's, not the parser's
    ("'r'\"m\" x", DENY_RM),
    ("echo $(cat <<'EOF'\nx\nEOF\nrm y\n)", DENY_RM),
    ("cat <<A <<'B'\n$(rm x)\nA\n$(ok)\nB", "unparseable"),  # two heredocs on one line
    ('echo "`ls\nrm x`"', DENY_RM),
    ("flock /tmp/l -c 'rm x'", DENY_RM),
    ("cat <(rm x)", DENY_RM),
    ("tee >(rm x)", DENY_RM),
    ("ls > $(rm x)", DENY_RM),
    ("{ ls; } > $(rm x)", DENY_RM),
    ("FOO=$(rm x) ls", DENY_RM),
    ("echo ${x:-$(rm x)}", DENY_RM),
    ("if true; then rm x; fi", DENY_RM),
    ("if false; then :; elif true; then :; else rm x; fi", DENY_RM),
    ("for i in 1; do rm x; done", DENY_RM),
    ("for i in $(rm x); do :; done", DENY_RM),
    ("while true; do rm x; done", DENY_RM),
    ("until false; do rm x; done", DENY_RM),
    ("f() { rm x; }; f", DENY_RM),
    ("function f { rm x; }", DENY_RM),
    ("eval 'rm x'", DENY_RM),
    ("trap 'rm x' EXIT", DENY_RM),
    ("alias ls=rm", DENY_RM),
    ("hash -p /bin/rm ls", DENY_RM),
    ("ls\nrm x", DENY_RM),
    ("ls # comment\nrm x", DENY_RM),
    ("cat <<EOF\n$(rm x)\nEOF", DENY_RM),
    ("cat <<EOF\n`rm x`\nEOF", DENY_RM),
    ("cat <<EOF\nit's ${v:-$(rm x)}\nEOF", DENY_RM),
    # multi-line substitutions, a comment before the `)`
    ("echo $(ls\nrm x\n)", DENY_RM),
    ("x=$(\n  ls\n  rm y\n)", DENY_RM),
    ('echo "$(ls # )\nrm x\n)"', DENY_RM),
    ("echo $(ls # )\nrm x\n)", DENY_RM),
    ("shutdown -h now", "tools.terminal.run.deny: shutdown"),
    # cannot be decided statically
    ("x=rm; $x file", "dynamic command name"),
    ("${X} file", "dynamic command name"),
    ("$'\\x72m' x", "dynamic command name"),
    ("{rm,x} y", "unparseable"),  # tree-sitter: a syntax error
    ("r?m x", "unparseable"),
    ("r*m x", "dynamic command name"),
    ("$(echo rm) x", "dynamic command name"),
    ('"$cmd" x', "dynamic command name"),
    ("${!x} y", "dynamic command name"),
    ("a=(rm); ${a[0]} x", "dynamic command name"),
    ("xargs -I{} {} < list", "dynamic command name"),
    ("find . -exec {} \\;", "dynamic command name"),
    ('eval "$CMD"', "dynamic shell code"),
    ('bash -c "$CMD"', "dynamic shell code"),
    ("timeout $T rm x", "dynamic shell code"),
    ("env $VARS ls", "dynamic shell code"),
    ("find $DIR -name x", "dynamic shell code"),
    ("echo 'rm -rf /' | xargs -0 bash -c", "dynamic shell code"),
    ("find . -exec sh -c 'cat {}' \\;", "dynamic shell code"),
    ("ls | xargs -I % sh -c 'cat %'", "dynamic shell code"),
    ('bash <<< "$CODE"', "dynamic shell code"),
    ("env 'BASH_FUNC_ls%%=() { cat; }' bash -c ls", "function import via environment"),
    ("echo 'oops", "unparseable"),
    ("$'${a' \\ ", "unparseable"),  # (bashlex 0.18 looped forever on this)
    ("echo \"<<'X'\"\nrm -rf /\nX", DENY_RM),  # `<<` inside a string is not a heredoc
    ("while true\ndo\nrm x\ndone", DENY_RM),
    ('echo "oops', "unparseable"),
    ("echo $(ls", "unparseable"),
    ("ls; ;", "unparseable"),
    # tree-sitter recovers from these with ERROR or MISSING nodes: refused
    ("if true; then rm x", DENY_RM),  # deny wins: rm is found before the refusal
    ("if true; then ls", "unparseable"),
    ("for x in a; do ls", "unparseable"),
    ("case x in a) ls", "unparseable"),
    ("echo ${x", "unparseable"),
    ("[[ -f x", "unparseable"),
    ("(( 1 +", "unparseable"),
    ("f() {", "unparseable"),
    ("echo `ls", "unparseable"),
    ("ls )", "unparseable"),
    ("cat <<EOF\nno terminator", "unparseable"),
    # the heredoc body starts after the logical line (after the string): rm really runs
    ("cat <<'EOF' \"\nEOF\n\"\nEOF\nrm -rf /\n'EOF'", DENY_RM),
    ("let 'a[$(rm x)]=1'", "unparseable"),
    # constructs bashlex could not parse: what they run is found
    ("(( $(rm x) ))", DENY_RM),
    ("(( a[$(rm x)] ))", DENY_RM),
    ("echo $(( $(rm x) ))", DENY_RM),
    ("echo hello-$((40+$(rm x)))", DENY_RM),
    ("echo $[ $(rm x) ]", DENY_RM),
    ("case $x in a) rm x;; esac", DENY_RM),
    ("case x in a|b) ls;; *) rm y;; esac", DENY_RM),
    ("case $(rm x) in a) ;; esac", DENY_RM),
    ("case x in $(rm x)) ;; esac", DENY_RM),
    ("[[ $(rm x) == x ]]", DENY_RM),
    ("[[ -f x && $(rm x) ]]", DENY_RM),
    ("[[ x =~ $(rm x) ]]", DENY_RM),
    ("[[ 'a[$(rm x)]' -eq 1 ]]", "unparseable"),  # arithmetic would run it
    ("a=( $(rm x) )", DENY_RM),
    ("a=(ok `rm x`)", DENY_RM),
    ("declare -a a=( $(rm x) )", DENY_RM),
    ("local x=$(rm y)", DENY_RM),
    ('export X="$(rm y)"', DENY_RM),
    ("a[$(rm x)]=1", DENY_RM),
    ("for ((i=0;i<3;i++)); do rm x; done", DENY_RM),
    ("for ((i=$(rm x);i<3;i++)); do :; done", DENY_RM),
    ("select x in a b; do rm x; done", DENY_RM),
    ("select x in $(rm x); do :; done", DENY_RM),
    ("function f() { rm x; }; f", DENY_RM),
    ("f() ( rm x ); f", DENY_RM),
    ('eval "rm x"', DENY_RM),
    ("eval 'ls; rm x'", DENY_RM),
    ('echo "${var:-$(rm x)}"', DENY_RM),
    ("echo ${var:=`rm x`}", DENY_RM),
    ("echo ${x/$(rm y)/z}", DENY_RM),
    ('echo "a $(echo "$(rm x)")"', DENY_RM),
    ("time rm x", DENY_RM),
    ("time -p rm x", DENY_RM),
    ("time ! rm x", "unparseable"),
    ("! rm x", DENY_RM),
    ("cat <<EOF && rm y\nbody\nEOF", DENY_RM),
    ("cat <<EOF | xargs rm\nx\nEOF", DENY_RM),
    ("cat <<EOF; rm y\nbody\nEOF", "unparseable"),  # tree-sitter: a syntax error
    ('echo "${var:=`rm x`}"', DENY_RM),
    ("echo ${x:-a`rm x`b}", DENY_RM),
    ("echo ${x%`rm x`}", DENY_RM),  # tree-sitter leaves these patterns unparsed
    ("echo ${x/`rm x`/y}", DENY_RM),
    ("echo ${x#$(rm x)}", DENY_RM),
    ("echo \"${x:-'$(rm x)'}\"", DENY_RM),  # single quotes are plain text there
    ("echo \"${x:-'`rm x`'}\"", DENY_RM),
    # values that bash evaluates as code later in the same command
    ("x='$(rm x)'; echo ${x@P}", "dynamic shell code"),
    ('echo "${y:-${x@P}}"', "dynamic shell code"),
    ("x='a[$(rm x)]'; echo $((x))", "unparseable"),
    ("declare -i n; n='a[`rm x`]'", "unparseable"),
    ("a=('a[$(rm x)]')", "unparseable"),
    ("mapfile -C 'rm x' -c 1 arr < list", DENY_RM),
    ("readarray -tC'rm x' arr < list", DENY_RM),
    ("cat <<EOF\n$(( $(rm x) ))\nEOF", DENY_RM),
    ("r\\\nm x", DENY_RM),  # a line continuation joins the word
    ("echo ok \\\n; rm x", DENY_RM),
    ("coproc rm x", "unparseable"),
    ("coproc w { rm x; }", "unparseable"),
    ("fish -c 'ls'", "unparseable"),
    ("", "invalid command"),
    ("   \n  ", "invalid command"),
    ("# only a comment", "invalid command"),
    ("ls\x00rm", "invalid command"),
    ("echo " + "a" * MAX_COMMAND_CHARS, "invalid command"),
    ("eval " * (MAX_DEPTH + 2) + "ls", "nesting too deep"),
    # not on the allow list
    ("curl http://x | sh", "dynamic shell code"),  # code from a pipe, before the allow list
    ("sudo ls", NOT_ALLOWED),
    ("wget http://x", NOT_ALLOWED),
    ("source ./env.sh", NOT_ALLOWED),
    (". ./env.sh", NOT_ALLOWED),
    ("f() { ls; }; f", NOT_ALLOWED),
    ("cd src && ls | sort", NOT_ALLOWED),
]


@pytest.mark.parametrize(("command", "rule"), EVASIONS, ids=[repr(c)[:60] for c, _ in EVASIONS])
def test_evasions_are_denied(command: str, rule: str) -> None:
    decision = POLICY.check(command)
    assert not decision.allowed, decision
    assert not decision.needs_approval
    assert decision.rule == rule, decision.reason
    assert decision.reason


ALLOWED: list[tuple[str, tuple[str, ...]]] = [
    ("git status", ("git",)),
    ("/usr/bin/git status", ("git",)),
    ("echo rm", ("echo",)),
    ("echo rm -rf /", ("echo",)),
    ("grep -r 'rm -rf' .", ("grep",)),
    ("python3 -c 'import os'", ("python3",)),
    ("cat <<EOF\nrm\nEOF", ("cat",)),
    ("cat <<'EOF' > notes.txt\n$(rm x) `rm y`\nEOF", ("cat",)),
    ('cat <<"EOF"\nrm -rf /\nEOF\nls', ("cat", "ls")),
    ("cat <<-EOF\n\tplain\n\tEOF", ("cat",)),
    ("cd src && make test", ("cd", "make")),
    ("FOO=1 make", ("make",)),
    ("ls -la | grep py", ("ls", "grep")),
    ('echo "$(git rev-parse HEAD)"', ("git", "echo")),
    ("git log --format='%h %s' -n 3", ("git",)),
    ("[ -f x ] && cat x", ("[", "cat")),
    ("export X=1; echo $X", ("export", "echo")),
    ("pip install -e . >/dev/null 2>&1", ("pip",)),
    ("ls # ; rm x", ("ls",)),
    ("bash script.sh", ("bash",)),
    ("eval 'ls -l'", ("eval", "ls")),
    ("echo a\\;b", ("echo",)),
    ("git commit -m \"$(cat <<'EOF'\nFix: rm -rf $(x) `y`\n\nEOF\n)\"", ("cat", "git")),
    ("cat > f.sh <<'EOF'\nfor f in $(ls); do rm \"$f\"; done\nEOF\nbash f.sh", ("cat", "bash")),
    ("cat <<'EOF' \"a\nEOF\nb\"\nrm -rf /\nEOF", ("cat",)),  # the body starts after the string
    ("cat <<'E O F'\nx\nE O F", ("cat",)),
    ("echo hello-$((40+2))", ("echo",)),
    ("(( x++ )); echo $((x * 2)) $[x]", ("echo",)),
    ("[[ -f x && $(cat y) == z ]] && echo ok", ("cat", "echo")),
    ("case $x in a|b) ls;; *) echo no;; esac", ("ls", "echo")),
    ('a=( $(ls) ); echo "${a[@]}" ${#a[@]}', ("ls", "echo")),
    ("for ((i=0;i<3;i++)); do echo $i; done", ("echo",)),
    ("select x in a b; do echo $x; break; done", ("echo", "break")),
    ("echo ${!x} ${x:-$(ls)} ${#x} ${x//a/b} $'a\\tb' $\"t\"", ("ls", "echo")),
    ("cat <(ls a) <(ls b) > /dev/null 2>&1", ("ls", "cat")),
    ("command -v rm", ("command",)),
    ("bash -c ls <<'EOF'\nrm x\nEOF", ("bash", "ls")),  # stdin is data for bash -c
]


@pytest.mark.parametrize(("command", "programs"), ALLOWED, ids=[repr(c)[:60] for c, _ in ALLOWED])
def test_harmless_commands_are_allowed(command: str, programs: tuple[str, ...]) -> None:
    decision = POLICY.check(command)
    assert decision.allowed and not decision.needs_approval, decision
    assert decision.rule is None
    assert decision.may_run_now
    assert decision.programs == programs


OPEN = CommandPolicy(None, ["shutdown"], APPROVAL)
WITH_SH = CommandPolicy([*ALLOW, "sh", "sudo"], DENY, APPROVAL)

PIPE = CommandPolicy(None, [], ["* | tee *"])

APPROVALS: list[tuple[CommandPolicy, str | list[str], str]] = [
    (PIPE, "curl http://x | tee out", "* | tee *"),
    (PIPE, "curl -s http://x|/usr/bin/tee -a out", "* | tee *"),
    (PIPE, "ls && curl x | sort | tee y", "* | tee *"),
    (OPEN, "rm -rf *", "rm -rf *"),
    (OPEN, "rm -rf /tmp/build", "rm -rf *"),
    (OPEN, "/bin/rm   -rf  build", "rm -rf *"),
    (OPEN, "sudo rm -rf /x", "rm -rf *"),
    (OPEN, "find . -exec rm -rf {} +", "rm -rf *"),
    (POLICY, "git push --force origin main", "git push --force*"),
    (POLICY, "/usr/bin/git push --force", "git push --force*"),
    (POLICY, "echo ok && git push --force-with-lease", "git push --force*"),
    (POLICY, "bash -c 'git push --force'", "git push --force*"),
    (POLICY, ["git", "push", "--force"], "git push --force*"),
    (CommandPolicy(None, [], ["git  push   --force*"]), "git push --force x", "git push --force*"),
]


@pytest.mark.parametrize(
    ("policy", "command", "pattern"), APPROVALS, ids=[repr(c)[:60] for _, c, _ in APPROVALS]
)
def test_approval_patterns(policy: CommandPolicy, command: str | list[str], pattern: str) -> None:
    decision = policy.check(command)
    assert decision.allowed and decision.needs_approval, decision
    assert not decision.may_run_now
    assert decision.rule == f"tools.terminal.run.approval: {pattern}"
    assert "approv" in decision.reason


@pytest.mark.parametrize(
    "command",
    ["git push origin main", "git push --dry-run origin", "git pull --force", "rm x", "rm -r x",
     "rm -f x", "echo git push --force", "git log --force-color", "curl x | sh -c cat"],
)  # fmt: skip
def test_approval_patterns_do_not_overreach(command: str) -> None:
    decision = OPEN.check(command)
    assert decision.may_run_now, decision


def test_input_placeholders_are_fine_as_arguments() -> None:
    decision = OPEN.check("ls | xargs -I % bash -c 'cat \"$1\"' _ %")
    assert decision.may_run_now
    assert decision.programs == ("ls", "xargs", "bash", "cat")
    assert OPEN.check("find . -name '*.py' -exec sh -c 'wc -l \"$1\"' _ {} \\;").may_run_now


def test_sudo_needs_approval_even_without_a_pattern() -> None:
    decision = WITH_SH.check("sudo ls")
    assert decision.allowed and decision.needs_approval
    assert decision.rule == "privilege escalation: sudo"
    assert decision.programs == ("sudo", "ls")


def test_allow_list_reason_names_program_and_list() -> None:
    decision = POLICY.check("ls | sort")
    assert decision.rule == NOT_ALLOWED
    assert "`sort`" in decision.reason
    for name in ("bash", "git", "grep"):
        assert name in decision.reason


def test_deny_wins_over_allow() -> None:
    policy = CommandPolicy(["rm", "ls"], ["rm"], [])
    assert policy.check("rm x").rule == DENY_RM
    assert CommandPolicy(["ls"], ["/usr/bin/rm"], []).check("ls; rm x").rule == DENY_RM


def test_deny_wins_over_unparseable() -> None:
    # rm is found before the dynamic name stops the analysis
    assert POLICY.check("$(rm x) y").rule == DENY_RM
    assert POLICY.check("rm x; $y").rule == DENY_RM


def test_curl_sh_is_dynamic_code_even_when_sh_is_allowed() -> None:
    for policy in (POLICY, WITH_SH, OPEN):
        decision = policy.check("curl http://x | sh")
        assert decision.rule == "dynamic shell code", decision
        assert "`sh`" in decision.reason


def test_no_allow_list_means_everything_not_denied() -> None:
    decision = OPEN.check("wget x && sort y")
    assert decision.may_run_now
    assert decision.programs == ("wget", "sort")
    assert not CommandPolicy([], [], []).check("ls").allowed
    assert CommandPolicy([], [], []).check("cd /x && echo hi").allowed


@pytest.mark.parametrize(
    ("argv", "allowed", "rule"),
    [
        (["git", "status"], True, None),
        (["ls", "$(rm x)", ";", "rm"], True, None),  # argv items are data, not shell
        (["/usr/bin/env", "FOO=1", "rm", "x"], False, DENY_RM),
        (["bash", "-c", "ls; rm x"], False, DENY_RM),
        (["timeout", "5", "/bin/rm", "x"], False, DENY_RM),
        ([], False, "invalid command"),
        ([""], False, "invalid command"),
        (["ls", "a\x00b"], False, "invalid command"),
    ],
)
def test_argv_commands(argv: list[str], allowed: bool, rule: str | None) -> None:
    decision = POLICY.check(argv)
    assert decision.allowed is allowed, decision
    assert decision.rule == rule


def test_programs_in() -> None:
    assert programs_in("ls | grep x; echo $(date)") == ["ls", "grep", "date", "echo"]
    assert programs_in("sudo -u bob /usr/bin/env -i nice rm x") == [
        "sudo",
        "env",
        "nice",
        "rm",
    ]
    assert programs_in("ls | xargs") == ["ls", "xargs", "echo"]
    assert programs_in("echo ok > out.txt 2>&1") == ["echo"]
    assert programs_in("A=1 B=2") == []


@pytest.mark.parametrize(
    ("command", "rule"),
    [("echo 'oops", "unparseable"), ("$CMD x", "dynamic command name"), ("", "invalid command")],
)
def test_programs_in_raises(command: str, rule: str) -> None:
    with pytest.raises(UnparseableCommand) as info:
        programs_in(command)
    assert isinstance(info.value, InvalidRequest)
    assert info.value.code == "unparseable_command"
    assert info.value.rule == rule
    assert info.value.to_dict()["details"]["rule"] == rule


def test_heredoc_placeholders_cannot_be_forged() -> None:
    # the body of a quoted heredoc is set aside under a random per-analysis name
    assert POLICY.check("bash <<EOF\n__agentbox_heredoc_0__\nEOF").rule == NOT_ALLOWED
    decision = POLICY.check("bash <<'EOF'\ncat x\nEOF")
    assert decision.may_run_now and decision.programs == ("bash", "cat")


def test_pathological_input_is_refused_quickly() -> None:
    for command in ["echo " + "$(" * 3000 + "ls" + ")" * 3000, "(" * 3000 + "ls" + ")" * 3000]:
        assert POLICY.check(command).rule == "nesting too deep"
    assert POLICY.check("cat <<EOF\n" + "$( " * 2000 + "\nEOF").rule == "unparseable"


def test_decision_is_frozen() -> None:
    decision = Decision(True, False, None, "ok")
    with pytest.raises(AttributeError):
        decision.allowed = False  # type: ignore[misc]


# --------------------------------------------------------------------------- files

PROTECTED = [".git/hooks/**", ".git/config", ".vscode/**", ".mcp.json", ".envrc"]
FILES = FilePolicy(max_bytes=1000, protected=PROTECTED, require_diff_summary=True)


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("/workspace/src/app.py", None),
        ("src/app.py", None),
        ("./src/../README.md", None),
        ("//workspace//a.txt", None),
        (".git/HEAD", None),
        ("x.envrc", None),
        (".git/hooksx", None),
        ("../etc/passwd", "tools.fs.write.root: /workspace"),
        ("/workspace/../etc/passwd", "tools.fs.write.root: /workspace"),
        ("/etc/passwd", "tools.fs.write.root: /workspace"),
        ("/workspacex/a", "tools.fs.write.root: /workspace"),
        (".git/hooks/pre-commit", "tools.fs.write.protected: .git/hooks/**"),
        ("/workspace/.git/hooks/deep/er/x", "tools.fs.write.protected: .git/hooks/**"),
        (".git/hooks", "tools.fs.write.protected: .git/hooks/**"),
        ("src/../.git/hooks/../hooks/post-checkout", "tools.fs.write.protected: .git/hooks/**"),
        (".git", "tools.fs.write.protected: .git/hooks/**"),
        ("/workspace", "tools.fs.write.protected: .git/hooks/**"),
        (".git/config", "tools.fs.write.protected: .git/config"),
        (".vscode/settings.json", "tools.fs.write.protected: .vscode/**"),
        (".mcp.json", "tools.fs.write.protected: .mcp.json"),
        ("pkg/.mcp.json", "tools.fs.write.protected: .mcp.json"),
        (".envrc", "tools.fs.write.protected: .envrc"),
        ("sub/dir/.envrc", "tools.fs.write.protected: .envrc"),
        ("r/.git/hooks/pre-commit", "tools.fs.write.protected: .git/hooks/**"),
        ("a/b/.git/config", "tools.fs.write.protected: .git/config"),
        (".GIT/hooks/pre-commit", "tools.fs.write.protected: .git/hooks/**"),
        ("R/.Git/Hooks", "tools.fs.write.protected: .git/hooks/**"),
        ("r/.git", "tools.fs.write.protected: .git/hooks/**"),
        (".Mcp.json", "tools.fs.write.protected: .mcp.json"),
        ("x\n/.git/hooks/a", "tools.fs.write.protected: .git/hooks/**"),
        (".vscode", "tools.fs.write.protected: .vscode/**"),
        ("r/.git/objects/ab", None),
        ("r/git/hooks/x", None),
        ("", "invalid path"),
        ("a\x00b", "invalid path"),
    ],
)
def test_file_write(path: str, rule: str | None) -> None:
    decision = FILES.check_write(path)
    assert decision.allowed is (rule is None), decision
    assert decision.rule == rule
    assert not decision.needs_approval


def test_file_read_ignores_protected_but_not_root() -> None:
    assert FILES.check_read(".git/config").allowed
    assert FILES.check_read("/etc/shadow").rule == "tools.fs.read.root: /workspace"


def test_file_size_limit() -> None:
    assert FILES.check_write("a.txt", size=1000).allowed
    decision = FILES.check_write("a.txt", size=1001)
    assert decision.rule == "tools.fs.write.max_bytes"
    assert "1000 bytes" in decision.reason
    assert FILES.check_read("a.txt", size=5000).rule == "tools.fs.read.max_bytes"
    assert FilePolicy().check_write("a.txt", size=10**12).allowed


def test_file_write_by_name_only() -> None:
    """A new empty directory or a link target is judged by its own name, not by what a
    directory of that name could contain."""
    for path in ("/workspace", ".git", "r/.git", ".git/hooksx", "r/.vscodex"):
        assert FILES.check_write(path, whole=False).allowed, path
    for path in (".git/hooks", "r/.git/hooks/x", ".vscode", ".Mcp.json", ".git/config"):
        assert not FILES.check_write(path, whole=False).allowed, path


def test_check_resolved_by_access() -> None:
    assert not FILES.check_resolved("/workspace/.git", "write").allowed
    assert FILES.check_resolved("/workspace/.git", "create_dir").allowed
    assert not FILES.check_resolved("/workspace/.git/hooks/x", "create_dir").allowed
    # a symlink may point out of the root (writes through it are judged there), not at a
    # protected path; a hard link may do neither (it is the same file)
    assert FILES.check_resolved("/usr/bin/python3", "symlink_to").allowed
    assert not FILES.check_resolved("/workspace/.Mcp.json", "symlink_to").allowed
    decision = FILES.check_resolved("/tmp/x", "hardlink_to")
    assert decision.rule == "tools.fs.write.root: /workspace"
    assert not FILES.check_resolved("/workspace/r/.git/config", "hardlink_to").allowed


def test_anchored_patterns() -> None:
    policy = FilePolicy(protected=["/.git/hooks/**", "/.mcp.json"])
    assert not policy.check_write(".git/hooks/x").allowed
    assert not policy.check_write(".GIT/HOOKS/x").allowed
    assert not policy.check_write(".git").allowed
    assert policy.check_write("r/.git/hooks/x").allowed
    assert policy.check_write("r/.git").allowed
    assert policy.check_write("r/.mcp.json").allowed


def test_file_move_checks_both_ends() -> None:
    assert FILES.check_move("a.txt", "b.txt").allowed
    assert not FILES.check_move("a.txt", ".git/hooks/pre-push").allowed
    assert not FILES.check_move(".git/config", "config.bak").allowed
    assert not FILES.check_move(".git", "old-git").allowed


def test_file_glob_semantics() -> None:
    policy = FilePolicy(protected=["/top.txt", "docs/*.md", "**/keys/*.pem", "[!a]bc", "out/"])
    denied = ["top.txt", "docs/a.md", "keys/k.pem", "a/b/keys/k.pem", "xbc", "out/x", "s/out",
              "x/docs/a.md", "DOCS/A.MD", "Top.txt"]  # fmt: skip
    allowed = ["sub/top.txt", "docs/sub/a.md", "keys/sub/k.pem", "abc", "outx"]
    for path in denied:
        assert not policy.check_write(path).allowed, path
    for path in allowed:
        assert policy.check_write(path).allowed, path
    assert not policy.check_write("docs").allowed  # contains docs/*.md


def test_file_root_and_relative_paths() -> None:
    policy = FilePolicy(root="/workspace/src")
    assert policy.check_write("src/a.py").allowed  # relative to /workspace
    decision = policy.check_write("README.md")
    assert decision.rule == "tools.fs.write.root: /workspace/src"
    assert "/workspace/src" in decision.reason
    assert FilePolicy(root="/").check_write("/etc/x").allowed
    with pytest.raises(ValueError):
        FilePolicy(root="workspace")


def test_summary_for() -> None:
    assert FILES.summary_for("a.txt", b"x\n", b"y\n") is not None
    assert FilePolicy().summary_for("a.txt", b"x\n", b"y\n") is None


# --------------------------------------------------------------------------- diffs


def test_diff_summary_modified() -> None:
    out = diff_summary("/workspace/f.txt", b"a\nb\nc\n", b"a\nB\nc\nd\n")
    lines = out.splitlines()
    assert lines[0] == "/workspace/f.txt: +2 -1 lines"
    assert "--- a/workspace/f.txt" in lines
    assert "+++ b/workspace/f.txt" in lines
    assert "-b" in lines and "+B" in lines and "+d" in lines


def test_diff_summary_new_file() -> None:
    out = diff_summary("new.py", None, b"print(1)\nprint(2)\n")
    assert out.startswith("new.py: +2 -0 lines (new file)")
    assert "--- /dev/null" in out


def test_diff_summary_binary() -> None:
    assert diff_summary("x.bin", b"\x00\x01", b"\x00\x01\x02") == (
        "x.bin: binary file changed (2 -> 3 bytes)"
    )
    assert "binary file changed (0 -> 2 bytes)" in diff_summary("y", None, b"\xff\xfe")
    assert "binary file changed (3 -> 1 bytes)" in diff_summary("z", b"abc", b"\x00")


def test_diff_summary_no_newline_and_no_change() -> None:
    out = diff_summary("f", b"a\n", b"a\nb")
    assert out.splitlines()[0] == "f: +1 -0 lines"
    assert "\\ No newline at end of file" in out
    assert diff_summary("f", b"same\n", b"same\n") == "f: +0 -0 lines (no changes)"


def test_diff_summary_truncates_but_counts_everything() -> None:
    old = b"".join(b"line %d\n" % i for i in range(500))
    new = b"".join(b"LINE %d\n" % i for i in range(500))
    out = diff_summary("big.txt", old, new, max_lines=20)
    lines = out.splitlines()
    assert lines[0] == "big.txt: +500 -500 lines"
    assert len(lines) == 22
    assert lines[-1].startswith("... (") and "more diff lines not shown" in lines[-1]


def test_remembered_decisions_are_the_same_decisions() -> None:
    policy = CommandPolicy(["ls", "echo"], ["rm"], ["ls -la *"])
    commands: list[str | list[str]] = ["ls /", "rm -rf /", "ls -la /tmp", ["ls", "-la", "/tmp"],
                                       "echo $(rm x)", "ls 'unterminated"]  # fmt: skip
    first = [policy.check(c) for c in commands]
    assert [policy.check(c) for c in commands] == first  # from the cache
    assert [CommandPolicy(["ls", "echo"], ["rm"], ["ls -la *"]).check(c) for c in commands] == first
    assert [d.allowed for d in first] == [True, False, True, True, False, False]
    # an argv is not confused with a string of the same characters
    assert policy.check(["ls /"]).programs != policy.check("ls /").programs


def test_the_decision_cache_is_bounded() -> None:
    policy = CommandPolicy(None, [], [])
    for i in range(2000):
        assert policy.check(f"echo {i}").allowed
    assert len(policy._decided) <= 512
