"""agentbox: isolated sandboxes for AI coding agents behind an audited tool gateway.

from agentbox import Sandbox

with Sandbox.create(memory="512MiB") as sb:
    print(sb.commands.run("echo hello").stdout)
"""

from agentbox.client.sandbox import AsyncSandbox, CommandHandle, Sandbox, Shell
from agentbox.errors import AgentboxError
from agentbox.runtime.output import CommandResult

__all__ = ["AgentboxError", "AsyncSandbox", "CommandHandle", "CommandResult", "Sandbox", "Shell"]
__version__ = "0.1.0"
