"""The sandbox processor's HTTP API: :func:`create_app`.

API routes need the merchant's ``api-key`` header (401 ``AU_01`` otherwise; the events routes
need the *admin* key instead, ``Sandbox(admin_api_key=...)``, and answer 401 when the sandbox
has none), count against the rate limit window and may get injected faults (see
:mod:`reconcile.sandbox.faults`; the list faults reach the list routes marked *list*). Every
response carries ``X-RateLimit-Limit``, ``X-RateLimit-Remaining`` and ``X-RateLimit-Reset``.
Errors answer ``{"error": {"type", "code", "message"}}`` (see :mod:`reconcile.sandbox.errors`).
Every answer carries only the fields of Hyperswitch's OpenAPI schema for that route.

API routes (merchant key)::

    GET  /health
    POST /customers                     GET  /customers/<id>
    GET  /customers/<id>/mandates       ([MandateResponse])
    POST /payments                      GET  /payments/<id>
    POST /payments/<id>                 (update)
    POST /payments/<id>/confirm         POST /payments/<id>/capture
    POST /payments/<id>/cancel          POST /payments/<id>/cancel_post_capture
    POST /payments/list                 list (seed dialect: {data, total_count, has_more})
    GET  /payments/list                 list (Hyperswitch dialect: {size, data})
    POST /refunds                       GET  /refunds/<id>
    POST /refunds/<id>                  (update)
    POST /refunds/list                  list ({count, total_count, data}; both dialects)
    POST /payouts/create                GET  /payouts/<id>
    PUT  /payouts/<id>                  POST /payouts/<id>/fulfill
    POST /payouts/<id>                  (update, as the OpenAPI documents it; same as PUT)
    GET  /payouts/list                  list ({size, data})
    POST /payouts/list                  list ({size, data, total_count})
    GET  /disputes/list                 list (bare array)
    GET  /disputes/<id>
    GET  /mandates/<id>                 (MandateResponse)
    POST /mandates/revoke/<id>          (MandateRevokedResponse; event mandate_revoked)

Events API (admin key in ``api-key``; ``<merchant_id>`` is the merchant or profile id)::

    POST /events/<merchant_id>                      list (EventListConstraints ->
                                                    {events, total_count}, initial attempts)
    GET  /events/<merchant_id>/<event_id>/attempts  [EventRetrieveResponse]
    POST /events/<merchant_id>/<event_id>/retry     manual retry, sent synchronously

Sandbox admin routes (no ``api-key``, no faults; they exist only in the sandbox)::

    GET    /__sandbox/stats                       counters: objects, webhooks, faults applied
    GET    /__sandbox/faults                      the fault configuration
    POST   /__sandbox/faults                      set faults (FaultController.configure_from_json)
    DELETE /__sandbox/faults                      no faults
    POST   /__sandbox/tick                        advance pending things one step (settles
                                                  async captures/voids, expires 7-day-old
                                                  authorisations, ...): {"changed": {...}}
    POST   /__sandbox/disputes                    {"payment_id", "amount"?, "reason"?,
                                                   "reason_code"?, "stage"?} open a dispute
    POST   /__sandbox/disputes/<id>/<action>      challenge|accept|win|lose|expire|cancel|
                                                  pre_arbitration|arbitration|reversal
    POST   /__sandbox/payments/<id>/authenticate  {"result": "success"|"failure"} (3-D Secure)
    POST   /__sandbox/refunds/<id>/fail           {"reason"?} late failure -> failed
    POST   /__sandbox/payouts/<id>/reverse        success -> reversed
    POST   /__sandbox/payouts/<id>/fail           {"reason"?} initiated|pending -> failed
    POST   /__sandbox/mandates                    {"customer_id"?, "card_number"?,
                                                   "card_exp_month"?, "card_exp_year"?,
                                                   "card_holder_name"?, "customer_acceptance"?,
                                                   "profile_id"?}
                                                  create an active mandate
    POST   /__sandbox/mandates/<id>/revoke        revoke (as POST /mandates/revoke/<id>)
    POST   /__sandbox/clock                       {"now": ts} | {"advance_seconds": n} |
                                                   {"real": true}
    GET    /__sandbox/events                      emitted webhook events and their attempts
    POST   /__sandbox/webhooks/flush              {"timeout": s} wait until delivered/given up
    POST   /__sandbox/webhooks/deliver            {"release_held"?} clock-driven mode: send
                                                  the attempts due now -> {"attempts": [...],
                                                  "next_due": ts|null}
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException

from reconcile.sandbox.clock import FrozenClock, format_timestamp, parse_timestamp
from reconcile.sandbox.errors import (
    SandboxError,
    invalid,
    processor_unavailable,
    rate_limited,
    unauthorized,
)
from reconcile.sandbox.faults import ApiFaultPlan
from reconcile.sandbox.state import Sandbox

logger = logging.getLogger(__name__)

ADMIN_PREFIX = "/__sandbox"
EVENTS_PREFIX = "/events/"
MAX_BODY_BYTES = 1024 * 1024


def create_app(sandbox: Sandbox) -> Flask:
    """A Flask app serving ``sandbox`` over HTTP."""
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions["sandbox"] = sandbox
    _register_hooks(app, sandbox)
    _register_api(app, sandbox)
    _register_admin(app, sandbox)
    return app


def json_response(data: Any, status: int = 200) -> Response:
    """A JSON response that keeps key order and non-ASCII text as the processor does."""
    return Response(
        json.dumps(data, ensure_ascii=False, separators=(",", ":")),
        status=status,
        mimetype="application/json",
    )


def _body() -> dict[str, Any]:
    """The request body as a JSON object (an empty body is ``{}``)."""
    raw = request.get_data(cache=True)
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise invalid("Invalid JSON body") from None
    if not isinstance(value, dict):
        raise invalid("The request body must be a JSON object")
    return value


def _register_hooks(app: Flask, sandbox: Sandbox) -> None:
    @app.before_request
    def guard() -> None:
        if request.path.startswith(ADMIN_PREFIX):
            return
        given = request.headers.get("api-key")
        if request.path.startswith(EVENTS_PREFIX):
            if not sandbox.check_admin_key(given):
                raise unauthorized()
        elif not sandbox.check_api_key(given):
            raise unauthorized()
        limiter = sandbox.rate_limiter
        allowed, remaining, reset = limiter.hit()
        g.rate = (remaining, reset)
        if not allowed:
            raise rate_limited(limiter.limit, reset, reset - int(time.time()))
        plan = sandbox.faults.plan_api(request.method, request.path)
        g.fault_plan = plan
        if plan.sleep_seconds:
            sandbox.sleep(plan.sleep_seconds)
        if plan.rate_limit_reset_seconds is not None:
            wait = plan.rate_limit_reset_seconds
            raise rate_limited(limiter.limit, int(time.time()) + wait, wait)
        if plan.error_status is not None:
            raise processor_unavailable(plan.error_status)

    @app.after_request
    def decorate(response: Response) -> Response:
        plan: ApiFaultPlan | None = g.get("fault_plan")
        if plan is not None and plan.error_after_status is not None:
            error = processor_unavailable(plan.error_after_status)
            response = json_response(error.body(), error.status)
        rate = g.get("rate")
        remaining, reset = rate if rate is not None else sandbox.rate_limiter.peek()
        response.headers.setdefault("X-RateLimit-Limit", str(sandbox.rate_limiter.limit))
        response.headers.setdefault("X-RateLimit-Remaining", str(max(remaining, 0)))
        response.headers.setdefault("X-RateLimit-Reset", str(reset))
        return response

    @app.errorhandler(SandboxError)
    def sandbox_error(error: SandboxError) -> Response:
        response = json_response(error.body(), error.status)
        for name, value in error.headers.items():
            response.headers[name] = value
        return response

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        code = {404: "IR_02", 405: "IR_03"}.get(status, "IR_04")
        message = {
            404: "Unrecognized request URL",
            405: "The HTTP method is not applicable for this API",
        }.get(status, error.description or "Invalid request")
        return json_response(SandboxError(status, code, "invalid_request", message).body(), status)

    @app.errorhandler(Exception)
    def unexpected(error: Exception) -> Response:
        logger.exception("sandbox request failed", extra={"action": "sandbox_internal_error"})
        body = SandboxError(500, "HE_00", "api_error", "Something went wrong").body()
        return json_response(body, 500)


def _list_fault() -> str | None:
    """The list fault planned for this request (``ignore_filters``/``repeat_pages``)."""
    plan: ApiFaultPlan | None = g.get("fault_plan")
    return None if plan is None else plan.list_fault


def _register_api(app: Flask, sandbox: Sandbox) -> None:
    @app.get("/health")
    def health() -> Response:
        return json_response({"status": "healthy"})

    @app.post("/customers")
    def create_customer() -> Response:
        return json_response(sandbox.create_customer(_body()))

    @app.get("/customers/<customer_id>")
    def get_customer(customer_id: str) -> Response:
        return json_response(sandbox.get_customer(customer_id))

    @app.post("/payments")
    def create_payment() -> Response:
        return json_response(sandbox.create_payment(_body()))

    @app.post("/payments/list")
    def list_payments() -> Response:
        return json_response(sandbox.list_payments(_body(), list_fault=_list_fault()))

    @app.get("/payments/list")
    def list_payments_get() -> Response:
        return json_response(
            sandbox.list_payments_hyperswitch(
                request.args.items(multi=True), list_fault=_list_fault()
            )
        )

    @app.get("/payments/<payment_id>")
    def get_payment(payment_id: str) -> Response:
        return json_response(sandbox.get_payment(payment_id))

    @app.post("/payments/<payment_id>")
    def update_payment(payment_id: str) -> Response:
        return json_response(sandbox.update_payment(payment_id, _body()))

    @app.post("/payments/<payment_id>/confirm")
    def confirm_payment(payment_id: str) -> Response:
        return json_response(sandbox.confirm_payment(payment_id, _body()))

    @app.post("/payments/<payment_id>/capture")
    def capture_payment(payment_id: str) -> Response:
        return json_response(sandbox.capture_payment(payment_id, _body()))

    @app.post("/payments/<payment_id>/cancel")
    def cancel_payment(payment_id: str) -> Response:
        return json_response(sandbox.cancel_payment(payment_id, _body()))

    @app.post("/payments/<payment_id>/cancel_post_capture")
    def cancel_post_capture(payment_id: str) -> Response:
        return json_response(sandbox.cancel_post_capture(payment_id, _body()))

    @app.post("/refunds")
    def create_refund() -> Response:
        return json_response(sandbox.create_refund(_body()))

    @app.post("/refunds/list")
    def list_refunds() -> Response:
        return json_response(sandbox.list_refunds(_body(), list_fault=_list_fault()))

    @app.get("/refunds/<refund_id>")
    def get_refund(refund_id: str) -> Response:
        return json_response(sandbox.get_refund(refund_id))

    @app.post("/refunds/<refund_id>")
    def update_refund(refund_id: str) -> Response:
        return json_response(sandbox.update_refund(refund_id, _body()))

    @app.post("/payouts/create")
    def create_payout() -> Response:
        return json_response(sandbox.create_payout(_body()))

    @app.get("/payouts/list")
    def list_payouts_get() -> Response:
        return json_response(
            sandbox.list_payouts_hyperswitch(
                request.args.items(multi=True), list_fault=_list_fault()
            )
        )

    @app.post("/payouts/list")
    def list_payouts() -> Response:
        return json_response(sandbox.list_payouts(_body(), list_fault=_list_fault()))

    @app.get("/payouts/<payout_id>")
    def get_payout(payout_id: str) -> Response:
        return json_response(sandbox.get_payout(payout_id))

    @app.put("/payouts/<payout_id>")
    @app.post("/payouts/<payout_id>")
    def update_payout(payout_id: str) -> Response:
        return json_response(sandbox.update_payout(payout_id, _body()))

    @app.post("/payouts/<payout_id>/fulfill")
    def fulfill_payout(payout_id: str) -> Response:
        return json_response(sandbox.fulfill_payout(payout_id, _body()))

    @app.get("/disputes/list")
    def list_disputes() -> Response:
        return json_response(
            sandbox.list_disputes(request.args.items(multi=True), list_fault=_list_fault())
        )

    @app.get("/disputes/<dispute_id>")
    def get_dispute(dispute_id: str) -> Response:
        return json_response(sandbox.get_dispute(dispute_id))

    @app.get("/mandates/<mandate_id>")
    def get_mandate(mandate_id: str) -> Response:
        return json_response(sandbox.get_mandate(mandate_id))

    @app.post("/mandates/revoke/<mandate_id>")
    def revoke_mandate(mandate_id: str) -> Response:
        return json_response(sandbox.revoke_mandate(mandate_id))

    @app.get("/customers/<customer_id>/mandates")
    def customer_mandates(customer_id: str) -> Response:
        return json_response(sandbox.list_customer_mandates(customer_id))

    @app.post("/events/<merchant_id>")
    def list_events(merchant_id: str) -> Response:
        return json_response(sandbox.list_events(merchant_id, _body(), list_fault=_list_fault()))

    @app.get("/events/<merchant_id>/<event_id>/attempts")
    def event_attempts(merchant_id: str, event_id: str) -> Response:
        return json_response(sandbox.event_attempts(merchant_id, event_id))

    @app.post("/events/<merchant_id>/<event_id>/retry")
    def retry_event(merchant_id: str, event_id: str) -> Response:
        return json_response(sandbox.retry_event(merchant_id, event_id))


def _register_admin(app: Flask, sandbox: Sandbox) -> None:
    @app.get(ADMIN_PREFIX + "/stats")
    def stats() -> Response:
        return json_response(sandbox.stats())

    @app.get(ADMIN_PREFIX + "/faults")
    def get_faults() -> Response:
        return json_response(sandbox.faults.to_json())

    @app.post(ADMIN_PREFIX + "/faults")
    def set_faults() -> Response:
        sandbox.faults.configure_from_json(_body())
        return json_response(sandbox.faults.to_json())

    @app.delete(ADMIN_PREFIX + "/faults")
    def reset_faults() -> Response:
        sandbox.faults.reset()
        return json_response(sandbox.faults.to_json())

    @app.post(ADMIN_PREFIX + "/tick")
    def tick() -> Response:
        return json_response({"changed": sandbox.tick()})

    @app.post(ADMIN_PREFIX + "/disputes")
    def open_dispute() -> Response:
        body = _body()
        payment_id = body.get("payment_id")
        if not isinstance(payment_id, str):
            raise invalid("payment_id (a string) is required")
        amount = body.get("amount")
        if amount is not None and (not isinstance(amount, int) or isinstance(amount, bool)):
            raise invalid("amount must be an integer")
        options = {k: body.get(k) for k in ("reason", "reason_code")}
        if any(v is not None and not isinstance(v, str) for v in options.values()):
            raise invalid("reason and reason_code must be strings")
        stage = body.get("stage", "dispute")
        if not isinstance(stage, str):
            raise invalid("stage must be a string")
        dispute = sandbox.open_dispute(
            payment_id,
            amount=amount,
            reason=options["reason"],
            reason_code=options["reason_code"],
            stage=stage,
        )
        return json_response(dispute)

    @app.post(ADMIN_PREFIX + "/disputes/<dispute_id>/<action>")
    def dispute_action(dispute_id: str, action: str) -> Response:
        return json_response(sandbox.dispute_action(dispute_id, action))

    @app.post(ADMIN_PREFIX + "/refunds/<refund_id>/fail")
    def fail_refund(refund_id: str) -> Response:
        return json_response(sandbox.fail_refund(refund_id, reason=_reason(_body())))

    @app.post(ADMIN_PREFIX + "/payouts/<payout_id>/reverse")
    def reverse_payout(payout_id: str) -> Response:
        return json_response(sandbox.reverse_payout(payout_id))

    @app.post(ADMIN_PREFIX + "/payouts/<payout_id>/fail")
    def fail_payout(payout_id: str) -> Response:
        return json_response(sandbox.fail_payout(payout_id, reason=_reason(_body())))

    @app.post(ADMIN_PREFIX + "/mandates")
    def create_mandate() -> Response:
        body = _body()
        names = ("customer_id", "card_number", "card_exp_month", "card_exp_year")
        options: dict[str, Any] = {}
        for name in (*names, "card_holder_name", "profile_id"):
            value = body.get(name)
            if value is not None and not isinstance(value, str):
                raise invalid(f"{name} must be a string")
            if value is not None:
                options[name] = value
        acceptance = body.get("customer_acceptance")
        if acceptance is not None and not isinstance(acceptance, dict):
            raise invalid("customer_acceptance must be an object")
        return json_response(sandbox.create_mandate(acceptance=acceptance, **options))

    @app.post(ADMIN_PREFIX + "/mandates/<mandate_id>/revoke")
    def admin_revoke_mandate(mandate_id: str) -> Response:
        return json_response(sandbox.revoke_mandate(mandate_id))

    @app.post(ADMIN_PREFIX + "/webhooks/deliver")
    def deliver() -> Response:
        release = _body().get("release_held", False)
        if not isinstance(release, bool):
            raise invalid("release_held must be true or false")
        try:
            report = sandbox.deliver_due(release_held=release)
        except RuntimeError as exc:
            raise invalid(str(exc)) from None
        due = sandbox.next_delivery_due()
        return json_response(
            {
                "attempts": [
                    {
                        "event_id": r.event_id,
                        "attempt_id": r.attempt_id,
                        "event_type": r.event_type,
                        "object_id": r.object_id,
                        "delivery_attempt": r.delivery_attempt,
                        "at": format_timestamp(r.at),
                        "status_code": r.status_code,
                        "error": r.error,
                        "final": r.final,
                    }
                    for r in report
                ],
                "next_due": None if due is None else format_timestamp(due),
            }
        )

    @app.post(ADMIN_PREFIX + "/payments/<payment_id>/authenticate")
    def authenticate(payment_id: str) -> Response:
        result = _body().get("result", "success")
        if result not in {"success", "failure"}:
            raise invalid("result must be success or failure")
        return json_response(sandbox.complete_authentication(payment_id, result == "success"))

    @app.post(ADMIN_PREFIX + "/clock")
    def clock() -> Response:
        body = _body()
        if body.get("real"):
            sandbox.set_clock(None)
            return json_response({"now": format_timestamp(sandbox.now()), "frozen": False})
        current = sandbox.clock
        frozen = current if isinstance(current, FrozenClock) else FrozenClock(sandbox.now())
        if "now" in body:
            when = parse_timestamp(body["now"], allow_naive=False)
            if when is None:
                raise invalid("now must be an ISO 8601 timestamp with an offset")
            frozen.set(when)
        advance = body.get("advance_seconds")
        if advance is not None:
            if not isinstance(advance, int | float) or isinstance(advance, bool):
                raise invalid("advance_seconds must be a number")
            frozen.advance(float(advance))
        sandbox.set_clock(frozen)
        return json_response({"now": format_timestamp(sandbox.now()), "frozen": True})

    @app.get(ADMIN_PREFIX + "/events")
    def events() -> Response:
        return json_response(sandbox.events())

    @app.post(ADMIN_PREFIX + "/webhooks/flush")
    def flush() -> Response:
        timeout = _body().get("timeout", 10)
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout < 0:
            raise invalid("timeout must be a non-negative number")
        return json_response({"drained": sandbox.flush_webhooks(float(timeout))})


def _reason(body: dict[str, Any]) -> str | None:
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise invalid("reason must be a string")
    return reason
