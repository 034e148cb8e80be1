"""One adapter per wire protocol the gateway speaks besides OpenAI chat completions.

Each module holds one protocol's knowledge: its request, response and stream
shapes, its error shape, how its agents compact, and the conversion of its
conversations to the internal (chat-completions-shaped) messages the engine and
the observe inference read. Forwarding, recording and inference are the shared
core's (``contextlab.gateway.observe``, ``services``, ``views``). Pure Python:
no Django import.
"""
