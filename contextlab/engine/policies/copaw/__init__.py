"""The ``copaw`` policy: the hook as CoPaw runs it.

``policy`` is the policy; ``reference`` is CoPaw's and ReMe's context
management reproduced function by function (checked against ReMe's own
vectors); ``shape`` turns engine messages into the AgentScope dicts those
functions take. The ``contextlab`` policy reuses ``reference`` to say what CoPaw
would have done.
"""

from __future__ import annotations
