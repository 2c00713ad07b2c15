"""The model endpoint's service and wire translation, and the provider pool behind it.
Its HTTP routes are a front end (``gateway/model_routes.py``).

service.py         ModelService: attribution, budgets, redaction, audit, metrics per call
wire.py            OpenAI chat completions and Anthropic messages <-> the pool's types
responses_wire.py  OpenAI Responses <-> the pool's types
models/providers/         adapters, health-ordered pool, retries, budgets
"""
