"""Model providers behind one interface: adapters, a health-ordered pool, budgets.

types.py      ChatRequest / ChatResponse / StreamEvent, failure categories
adapter.py    shared HTTP plumbing and failure classification
openai.py     OpenAI chat completions (and compatible local servers)
anthropic.py  Anthropic messages
health.py     fail score, circuit breaker, Retry-After per provider
pool.py       routing, retries, failover, outbound redaction
budget.py     per-project daily tokens and USD, budgets and alerts (SQLite)
"""

from agentbox.models.providers.budget import Alert, BudgetLedger
from agentbox.models.providers.health import BreakerSettings
from agentbox.models.providers.pool import ProviderPool, adapter_for
from agentbox.models.providers.types import (
    Category,
    ChatRequest,
    ChatResponse,
    Image,
    Message,
    StreamEvent,
    Tool,
    ToolCall,
    Usage,
)

__all__ = [
    "Alert",
    "BreakerSettings",
    "BudgetLedger",
    "Category",
    "ChatRequest",
    "ChatResponse",
    "Image",
    "Message",
    "ProviderPool",
    "StreamEvent",
    "Tool",
    "ToolCall",
    "Usage",
    "adapter_for",
]
