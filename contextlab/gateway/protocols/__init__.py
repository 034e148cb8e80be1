"""One adapter per wire protocol the gateway speaks besides chat completions.

Each adapter holds everything that protocol's shapes mean (requests, answers,
streamed events, errors, the agents' compaction signatures) and converts a call
to the chat-completions message shape the shared forward/record/infer core and
the engine understand. Pure Python: no Django import.
"""
