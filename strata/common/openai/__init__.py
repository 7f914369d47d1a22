"""The OpenAI-compatible API that the worker serves and the router fronts: requests parsed and
refused alike (``protocol``, ``messages``, ``chat_template``), errors in OpenAI's shape
(``errors``), the optional API key (``auth``), the request id in every log line
(``request_id``) and the model list (``model_list``). A bad request gets the same answer from
the router as from a worker, without touching one."""
