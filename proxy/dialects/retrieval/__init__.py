"""The retrieval tool on each wire format: its definition in a request's tools, the calls of
it in an answer, the conversation continued with the proxy's results, and the answer the
client gets (the proxy's calls taken out, the usage of every upstream call added up)."""

from proxy.dialects.retrieval.base import Call, ToolCalls, summed_usage
from proxy.dialects.retrieval.chat import ChatCalls
from proxy.dialects.retrieval.messages import MessagesCalls
from proxy.dialects.retrieval.responses import ResponsesCalls

TOOL_CALLS: dict[str, ToolCalls] = {
    "chat": ChatCalls(),
    "responses": ResponsesCalls(),
    "messages": MessagesCalls(),
}

__all__ = ["TOOL_CALLS", "Call", "ToolCalls", "summed_usage"]
