"""Recording what the client sends to Prism and judging it against the patched contract.

Prism rejects requests whose declared parameters or body break their schemas, but it cannot
reject what the contract does not mention: it ignores unknown query parameters (the real
server's ``deny_unknown_fields`` answers 400) and unknown body fields (where the schema has no
``additionalProperties: false``). :class:`ContractRecorder` hooks the client's
``requests.Session`` and adds those checks, so an exchange passes only if

* Prism answered 2xx with no ``sl-violations`` header (its request and response checks), and
* every query parameter and every top-level JSON body field is declared by the operation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import requests

__all__ = ["ContractRecorder", "Exchange", "RequestBudgetExceeded"]

JSON = dict[str, Any]


class RequestBudgetExceeded(AssertionError):
    """A test sent more requests than it allowed (a pager looping on mock data)."""


@dataclass(frozen=True)
class Exchange:
    """One request the client sent and Prism's answer."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...]
    body: Any
    status: int
    violations: tuple[JSON, ...]
    detail: str

    def describe(self) -> str:
        query = "&".join(f"{k}={v}" for k, v in self.query)
        body = "" if self.body is None else f" body={json.dumps(self.body, sort_keys=True)}"
        return f"{self.method} {self.path}{'?' + query if query else ''}{body} -> {self.status}"


@dataclass
class ContractRecorder:
    """Session hook: records each exchange and reports what the contract rejects."""

    spec: JSON = field(repr=False)
    max_requests: int = 50
    exchanges: list[Exchange] = field(default_factory=list)

    def attach(self, session: requests.Session) -> requests.Session:
        session.hooks["response"].append(self._record)
        return session

    def _record(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        request = response.request
        parts = urlsplit(request.url or "")
        raw = request.body
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        violations: tuple[JSON, ...] = ()
        header = response.headers.get("sl-violations")
        if header:
            violations = tuple(json.loads(header))
        detail = ""
        if not 200 <= response.status_code < 300:
            detail = response.text[:2000]
        self.exchanges.append(
            Exchange(
                method=(request.method or "").upper(),
                path=parts.path,
                query=tuple(parse_qsl(parts.query, keep_blank_values=True)),
                body=body,
                status=response.status_code,
                violations=violations,
                detail=detail,
            )
        )
        if len(self.exchanges) > self.max_requests:
            raise RequestBudgetExceeded(
                f"more than {self.max_requests} requests in one test; last: "
                f"{self.exchanges[-1].describe()}"
            )

    # -- judging -------------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """Every way a recorded exchange broke the contract (empty: all accepted)."""
        found: list[str] = []
        for exchange in self.exchanges:
            found.extend(f"{exchange.describe()}: {p}" for p in self.problems_of(exchange))
        return found

    def problems_of(self, exchange: Exchange) -> list[str]:
        found: list[str] = []
        if not 200 <= exchange.status < 300:
            found.append(f"Prism answered {exchange.status}: {exchange.detail}")
        for violation in exchange.violations:
            where = ".".join(str(part) for part in violation.get("location", []))
            found.append(f"violation at {where}: {violation.get('message')}")
        operation = self.operation(exchange.method, exchange.path)
        if operation is None:
            found.append(
                "no such operation in the contract (or not in CONTRACT_PATHS of "
                "tests/contract/conftest.py)"
            )
            return found
        declared = self.query_names(exchange.path, operation)
        for name, _ in exchange.query:
            if name not in declared:
                found.append(f"undeclared query parameter {name!r} (declared: {sorted(declared)})")
        if isinstance(exchange.body, dict):
            forms = self.body_forms(operation)
            if forms is not None:
                # The body must be one form (anyOf/oneOf): mixing two forms' fields is not
                # declared, even if each field is declared by some form. Judged by the form
                # declaring most of the body.
                best = max(forms, key=lambda form: len(form & set(exchange.body)))
                for name in exchange.body:
                    if name not in best:
                        found.append(f"undeclared body field {name!r}")
        return found

    def assert_accepted(self) -> None:
        """Fail unless the client sent something and the contract accepted all of it."""
        assert self.exchanges, "the client sent no request"
        problems = self.problems()
        assert not problems, "the contract rejects:\n" + "\n".join(problems)

    # -- the spec -----------------------------------------------------------------------------

    def _path_item(self, path: str) -> tuple[str, JSON] | None:
        """The spec path matching ``path``: literal segments win over templated ones."""
        candidates: list[tuple[int, str, JSON]] = []
        for template, item in self.spec["paths"].items():
            pattern = "^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$"
            if re.match(pattern, path):
                candidates.append((template.count("{"), template, item))
        if not candidates:
            return None
        _, template, item = min(candidates, key=lambda c: c[0])
        return template, item

    def operation(self, method: str, path: str) -> JSON | None:
        found = self._path_item(path)
        if found is None:
            return None
        operation = found[1].get(method.lower())
        return operation if isinstance(operation, dict) else None

    def query_names(self, path: str, operation: JSON) -> set[str]:
        found = self._path_item(path)
        shared = found[1].get("parameters", []) if found else []
        names = set()
        for parameter in [*shared, *(operation.get("parameters") or [])]:
            parameter = self._resolve(parameter)
            if parameter.get("in") == "query":
                names.add(parameter["name"])
        return names

    def body_forms(self, operation: JSON) -> list[set[str]] | None:
        """The field sets of each form of the JSON body (``None``: any field is fine).

        A body schema whose top level is ``anyOf``/``oneOf`` of objects has one form per
        alternative; any other has one form.
        """
        content = (operation.get("requestBody") or {}).get("content", {})
        media = content.get("application/json")
        if not isinstance(media, dict) or "schema" not in media:
            return None
        schema = self._resolve(media["schema"])
        alternatives = [
            part
            for key in ("anyOf", "oneOf")
            for part in schema.get(key, [])
            if isinstance(part, dict) and part.get("enum") != [None]
        ]
        if not alternatives or "properties" in schema or "allOf" in schema:
            names = self._property_names(schema, depth=0)
            return None if names is None else [names]
        forms = [self._property_names(part, depth=1) for part in alternatives]
        if any(form is None for form in forms):
            return None
        return [form for form in forms if form is not None]

    def _property_names(self, schema: Any, depth: int) -> set[str] | None:
        if depth > 20 or not isinstance(schema, dict):
            return None
        schema = self._resolve(schema)
        names: set[str] = set(schema.get("properties", {}))
        open_ended = (
            not names
            and schema.get("type") in (None, "object")
            and not any(key in schema for key in ("allOf", "anyOf", "oneOf"))
        )
        if open_ended or schema.get("additionalProperties") not in (None, False):
            return None
        for key in ("allOf", "anyOf", "oneOf"):
            for part in schema.get(key, []):
                if isinstance(part, dict) and part.get("enum") == [None]:
                    continue
                more = self._property_names(part, depth + 1)
                if more is None:
                    return None
                names |= more
        return names

    def _resolve(self, node: JSON) -> JSON:
        seen = 0
        while "$ref" in node and seen < 20:
            target: Any = self.spec
            for part in node["$ref"].removeprefix("#/").split("/"):
                target = target[part]
            node, seen = target, seen + 1
        return node
