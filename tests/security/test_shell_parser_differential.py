"""The shell analysis against real bash: a command bash runs is never missed.

Each command hides ``touch ran`` in a construct where a parser can go wrong (here-documents,
line continuations, quoting, substitutions, arithmetic, redirections). It is run by real
bash in an empty directory; whenever bash created ``ran``, the policy (``touch`` denied) must
not have allowed the command. A parser that misreads where a heredoc ends, joins or splits
words differently, or drops a substitution, fails here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agentbox.policy.tool_policy import CommandPolicy

T = "touch ran"
CASES = [
    # here-documents
    f"cat <<EOF\n$({T})\nEOF",
    f"cat <<EOF\n`{T}`\nEOF",
    f"cat <<EOF\n${{x:-`{T}`}}\nEOF",
    f"cat <<EOF\n$((1+$({T})))\nEOF",
    f"cat <<'EOF'\n$({T})\nEOF",
    f"cat <<\\EOF\n$({T})\nEOF",
    f"cat <<EOF\n\\$({T})\nEOF",
    f"cat <<'EOF' \"\nEOF\n\"\nEOF\n{T}\n'EOF'",
    f"cat <<'EOF' \"a\nEOF\nb\"\n{T}\nEOF",
    f"cat <<EOF\nx\n EOF\nEOF\n{T}",
    f"cat <<EOF\nEOF \n{T}\nEOF",
    f"cat <<-EOF\n\tx\n\tEOF\n{T}",
    f"cat << EOF\nx\nEOF\n{T}",
    f'cat <<"E"OF\nx\nEOF\n{T}',
    f"cat <<EOF\nEOF\n{T}",
    f"cat <<EOF\nx\nEOF\n\n{T}",
    f"cat <<EOF && {T}\nx\nEOF",
    f"cat <<EOF | cat; {T}\nx\nEOF",
    f"cat <<EOF > /dev/null\nbody\nEOF\n{T}",
    f"cat > /dev/null <<EOF\nbody $({T})\nEOF",
    f"echo x | cat <<EOF | cat\nbody\nEOF\n{T}",
    f"while read x; do {T}; done <<EOF\nline\nEOF",
    f"f() {{ cat <<EOF\n$({T})\nEOF\n}}; f",
    f"if true; then cat <<EOF\nx\nEOF\nfi; {T}",
    f"x=$(cat <<EOF\n$({T})\nEOF\n)",
    f'echo "$(cat <<EOF\nx\nEOF\n)"; {T}',
    f"echo $(cat <<'EOF'\nx\nEOF\n{T}\n)",
    f"case x in x) cat <<EOF\ny\nEOF\n;; esac; {T}",
    f"cat <<EOF\n$(echo EOF)\n{T}\nEOF",
    f"bash <<EOF\n{T}\nEOF",
    f"bash <<'EOF'\n{T}\nEOF",
    f"bash <<< '{T}'",
    f"cat <<< x; {T}",
    f"cat <<<$({T})",
    # line continuations and comments
    "tou\\\nch ran",
    f"echo a \\\n; {T}",
    f"echo x # comment \\\n{T}",
    f"echo 'a\\\n'; {T}",
    f'echo "a\\\nb"; {T}',
    'echo "$\\\n(touch ran)"',
    "echo $\\\n(touch ran)",
    "cat <<EOF\n$\\\n(touch ran)\nEOF",
    "cat <<EOF\n`tou\\\nch ran`\nEOF",
    f'echo "a\\\\\n"; {T}',
    f"echo \\\\\n{T}",
    f"[[ x =~ a\\\nb ]]; {T}",
    f"cat <<EOF\na \\\\\n$({T})\nEOF",
    f"# comment\n{T}",
    f"echo x; #; {T}",
    f"echo x#; {T}",
    f"echo $#; {T}",
    f"echo ${{#}}; {T}",
    f"echo ${{x#*/}}; {T}",
    # quoting
    "t\\ouch ran",
    "\"tou\"'ch' ran",
    f"echo $'a\\'b'; {T}",
    f'echo "a\\"b"; {T}',
    f"echo 'a'\\''b'; {T}",
    f'echo $"x"; {T}',
    f"echo \\$({T})",
    f"echo '$({T})'",
    f"echo a{{b,c}} {{a..c}} ~ [a] *; {T}",
    # substitutions
    f"echo `echo \\`{T}\\``",
    f"echo $(echo $({T}))",
    f"echo $( : ')' ; {T} )",
    f'echo "$(echo ")"; {T})"',
    f'echo "${{x:-$({T})}}"',
    f'echo "${{x:-"$({T})"}}"',
    f": ${{x:=$({T})}}",
    f": ${{x:-`{T}`}}",
    f"echo ${{x/y/$({T})}}",
    f"echo ${{x#$({T})}}",
    f"echo ${{x%`{T}`}}",
    f"echo ${{x/`{T}`/y}}",
    f"echo \"${{x:-'$({T})'}}\"",
    f"echo \"${{x:-'`{T}`'}}\"",
    f"echo ${{x:+`{T}`}}",
    f": ${{x?`{T}`}}",
    f"x='$({T})'; echo ${{x@P}}",
    f"x='a[$({T})]'; echo $((x))",
    f"declare -i x; x='a[$({T})]'",
    f"mapfile -C '{T}' -c 1 arr <<< a",
    f"echo ${{a[$({T})]}}",
    f"echo <({T})",
    f"cat < <({T})",
    f"echo >({T}); sleep 0.2",
    f"echo $(<ran); {T}",
    # arithmetic
    f"echo $((1)); {T}",
    f"echo $(( $({T}) ))",
    f"echo $[$({T})]",
    f"(( $({T}) ))",
    f": $(( a[$({T})] ))",
    f"for ((i=$({T}); i<1; i++)); do :; done",
    f"echo $((1<<2)); {T}",
    f"echo $((x<<2))\n{T}",
    f"(( x = 1 << 2 )); {T}",
    f"let x=1+2; {T}",
    # conditionals, case, loops, functions, arrays
    f"[[ -n $({T}) ]]",
    f"[[ x =~ ^a|b$ ]]; {T}",
    f"[[ x == @(a|b) ]]; {T}",
    f'[ -n "$({T})" ]',
    f"case x in x) {T};; esac",
    f"case x in (x) {T};; esac",
    f"case $({T}) in *) ;; esac",
    f"for i in 1; {{ {T}; }}",
    f"for i in $({T}); do :; done",
    f"select x in a; do {T}; break; done <<< 1",
    f"until {T}; do :; done",
    f"while ! {T}; do :; done",
    f"if {T}; then :; fi",
    f"f() {{ {T}; }}; f",
    f"function f {{ {T}; }}; f",
    f"f() ( {T} ); f",
    f"a=([0]=$({T}))",
    f"a=( $({T}) )",
    f"declare x=$({T})",
    f"export x=`{T}`",
    f"local_x=$({T}) true",
    # lists, pipelines, redirections
    f"echo x;{T}",
    f"echo x & {T}; wait",
    f"echo x&&{T}",
    f"false||{T}",
    f"echo x|{T}",
    f"echo x |& {T}",
    f"{{ {T}; }}",
    f"({T})",
    f"! {T}",
    f"time {T}",
    f"time -p {T}",
    f"time ! {T}",
    f"time -p ! {T}",
    f"> out {T}",
    f"2>/dev/null {T}",
    f"{T} 2>&1",
    f"echo 2>&1 $({T})",
    f"exec 3>&1; {T}",
    f"echo x >| f; {T}",
    f"echo x &> /dev/null; {T}",
    f"echo x 3<>f; {T}",
    f"{{ echo; }} 2>&1 | {T}",
    f'IFS=, read a b <<< "1,2"; {T}',
    f"eval '{T}'",
    f"bash -c '{T}'",
    f'script -qc "{T}" /dev/null',
    f"flock -xc '{T}' lockfile",
    f"coproc {T}; wait",
    f"cat <<A <<B\nx\nA\ny\nB\n{T}",
    f"cat <<EOF; {T}\nx\nEOF",
]

POLICY = CommandPolicy(None, ["touch"], [])


def _bash(command: str, cwd: Path) -> None:
    subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)},
    )


@pytest.mark.parametrize("command", CASES, ids=[repr(c)[:50] for c in CASES])
def test_what_bash_runs_the_policy_sees(command: str, tmp_path: Path) -> None:
    _bash(command, tmp_path)
    if (tmp_path / "ran").exists():
        decision = POLICY.check(command)
        assert not decision.allowed, (command, decision)


SPARED = [
    f"echo '$({T})'",
    f"cat <<'EOF'\n$({T})\nEOF",
    f"cat <<\\EOF\n`{T}`\nEOF",
    f"cat <<'EOF' \"a\nEOF\nb\"\n{T}\nEOF",
    f"cat <<EOF\n$(echo EOF)\n{T}\nEOF",
    f"echo x; #; {T}",
    f"echo '{T}' | cat",
    "cat <<'EOF'\n$\\\n(touch ran)\nEOF",
    "cat <<EOF > s.sh\ncmd \\\n --flag\nEOF",
]


@pytest.mark.parametrize("command", SPARED, ids=[repr(c)[:50] for c in SPARED])
def test_what_bash_does_not_run_is_not_denied(command: str, tmp_path: Path) -> None:
    """The other direction, where the parser could be too eager (false denials)."""
    _bash(command, tmp_path)
    assert not (tmp_path / "ran").exists(), command
    assert POLICY.check(command).may_run_now, command


def test_most_cases_really_run_the_hidden_command(tmp_path: Path) -> None:
    ran = 0
    for i, command in enumerate(CASES):
        (tmp_path / str(i)).mkdir()
        _bash(command, tmp_path / str(i))
        ran += (tmp_path / str(i) / "ran").exists()
    assert ran >= 0.8 * len(CASES), ran
