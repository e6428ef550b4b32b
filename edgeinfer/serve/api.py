"""The HTTP routes of ``edgeinfer serve`` on Starlette, and their OpenAPI document.

Starlette alone, not FastAPI over it: every endpoint reads and checks its own body (``prep``, off the event loop
when large), so FastAPI's per-route validation went unused, and it cost the HTTP process 7.4 MiB of RSS
(bench/README.md "The HTTP process without FastAPI"). :class:`Api` collects each route with what its
documentation needs; ``/openapi.json`` is built from the pydantic models on the first request for it, not at
start-up, and ``/docs`` is Swagger UI's page for it (https://swagger.io/docs/open-source-tools/swagger-ui/).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

ERROR_CODES = (400, 401, 404, 413, 429, 500, 503, 504)


@dataclass(frozen=True)
class Endpoint:
    path: str
    method: str
    name: str
    doc: str
    tag: str
    body: Any = None  # the pydantic model of the JSON body
    response: Any = None  # the pydantic model of a 200 answer
    responses: dict[int, str] = field(default_factory=dict)  # other documented answers: code → description
    errors: bool = False  # answers edgeinfer's JSON errors (schemas.ErrorResponse)


class Api:
    """Routes and their documentation, gathered by decorators: ``@api.get(path, tag=...)``,
    ``@api.post(path, tag=..., body=Model, response=Model)``. An endpoint takes the Starlette request and returns
    a Response; :meth:`routes` gives them, with ``/openapi.json`` and ``/docs``, to ``Starlette(routes=...)``."""

    def __init__(self, title: str, version: str, description: str):
        self.info = {"title": title, "version": version, "description": description}
        self.endpoints: list[tuple[Endpoint, Callable]] = []

    def route(self, method: str, path: str, tag: str, **doc: Any) -> Callable[[Callable], Callable]:
        def add(fn: Callable) -> Callable:
            text = " ".join((fn.__doc__ or "").split())
            self.endpoints.append((Endpoint(path, method, fn.__name__, text, tag, **doc), fn))
            return fn

        return add

    def get(self, path: str, tag: str, **doc: Any) -> Callable[[Callable], Callable]:
        return self.route("GET", path, tag, **doc)

    def post(self, path: str, tag: str, **doc: Any) -> Callable[[Callable], Callable]:
        return self.route("POST", path, tag, **doc)

    def routes(self) -> list[Route]:
        doc = functools.cache(lambda: document(self.info, [e for e, _ in self.endpoints]))
        return [*(Route(e.path, fn, methods=[e.method], name=f"{e.name} {e.path}") for e, fn in self.endpoints),
                Route("/openapi.json", lambda request: JSONResponse(doc()), methods=["GET"]),
                Route("/docs", lambda request: HTMLResponse(swagger_page(self.info["title"])), methods=["GET"])]


def document(info: dict[str, str], endpoints: list[Endpoint]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``endpoints``: bodies and answers as their models' JSON schemas, the models
    they refer to under ``components.schemas``."""
    from edgeinfer.serve.schemas import ErrorResponse

    schemas: dict[str, Any] = {}

    def schema_of(model: Any) -> dict[str, Any]:
        s = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(s.pop("$defs", {}))
        schemas[model.__name__] = s
        return {"$ref": f"#/components/schemas/{model.__name__}"}

    def json_content(model: Any) -> dict[str, Any]:
        return {"application/json": {"schema": schema_of(model) if model is not None else {}}}

    paths: dict[str, dict[str, Any]] = {}
    for e in endpoints:
        responses: dict[str, Any] = {"200": {"description": "Successful Response",
                                             "content": json_content(e.response)}}
        responses.update({str(c): {"description": d} for c, d in e.responses.items()})
        if e.errors:
            responses.update({str(c): {"description": "Error", "content": json_content(ErrorResponse)}
                              for c in ERROR_CODES})
        op = {"tags": [e.tag], "summary": e.name.replace("_", " ").title(), "description": e.doc,
              "operationId": re.sub(r"\W", "_", f"{e.name}{e.path}_{e.method.lower()}"), "responses": responses}
        if e.body is not None:
            op["requestBody"] = {"required": True, "content": json_content(e.body)}
        paths.setdefault(e.path, {})[e.method.lower()] = op
    return {"openapi": "3.1.0", "info": info, "paths": paths, "components": {"schemas": schemas}}


def swagger_page(title: str) -> str:
    """Swagger UI over /openapi.json, its script and style from jsdelivr (read by the browser that opens /docs,
    never by the server), as FastAPI serves it."""
    cdn = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5"
    return (f'<!doctype html><html><head><title>{title} - Swagger UI</title>'
            f'<link rel="stylesheet" href="{cdn}/swagger-ui.css"></head><body><div id="swagger-ui"></div>'
            f'<script src="{cdn}/swagger-ui-bundle.js"></script><script>SwaggerUIBundle({{url: "/openapi.json", '
            'dom_id: "#swagger-ui", presets: [SwaggerUIBundle.presets.apis, '
            'SwaggerUIBundle.SwaggerUIStandalonePreset], layout: "BaseLayout"})</script></body></html>')
