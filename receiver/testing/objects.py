"""Realistic Hyperswitch objects for the test kit: one builder per kind, each taking
``(object_id, status, amount, currency, merchant_id, now)`` and returning the object in the
processor's field order (``serde`` serialises struct fields in order). :func:`build_event`
(:mod:`receiver.testing.factories`) wraps them into webhook bodies.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final, TypeAlias

from receiver.core.wire import format_timestamp

DEFAULT_PROFILE_ID: Final = "pro_4oJzmWIss8F1SBf93O8w"
ALPHANUMERIC: Final = string.ascii_letters + string.digits


def random_alnum(length: int) -> str:
    return "".join(secrets.choice(ALPHANUMERIC) for _ in range(length))


def new_id(prefix: str, length: int = 20) -> str:
    """A Hyperswitch-style object id: ``prefix`` + ``_`` + ``length`` random alphanumerics."""
    return f"{prefix}_{random_alnum(length)}"


def payment_object(
    object_id: str,
    status: str | None,
    amount: int,
    currency: str,
    merchant_id: str,
    now: datetime,
) -> dict[str, Any]:
    captured = status in {"succeeded", "cancelled_post_capture"}
    partially = status in {"partially_captured", "partially_captured_and_capturable"}
    authorised = status in {
        "requires_capture",
        "partially_authorized_and_requires_capture",
        "partially_captured_and_capturable",
        "processing",
        "partially_captured_and_processing",
    }
    manual = status in {
        "requires_capture",
        "partially_authorized_and_requires_capture",
        "partially_captured",
        "partially_captured_and_capturable",
        "partially_captured_and_processing",
    }
    if status == "partially_authorized_and_requires_capture":
        capturable = amount * 3 // 4
    elif status == "partially_captured_and_capturable":
        capturable = amount - amount // 2
    elif authorised:
        capturable = amount
    else:
        capturable = 0
    if captured:
        received: int | None = amount
    elif partially or status == "partially_captured_and_processing":
        received = amount // 2
    else:
        received = None
    failed = status == "failed"
    needs_action = status in {"requires_customer_action", "requires_merchant_action"}
    created = now - timedelta(seconds=42)
    customer_id = "cus_y3oqhf46pyzuxjbcn2gi"
    body: dict[str, Any] = {
        "payment_id": object_id,
        "merchant_id": merchant_id,
        "status": status,
        "amount": amount,
        "net_amount": amount,
        "shipping_cost": None,
        "amount_capturable": capturable,
        "amount_received": received,
        "processor_merchant_id": merchant_id,
        "connector": "stripe",
        "client_secret": f"{object_id}_secret_{random_alnum(20)}",
        "created": format_timestamp(created),
        "modified_at": format_timestamp(now),
        "currency": currency,
        "customer_id": customer_id,
        "customer": {
            "id": customer_id,
            "name": "John Doe",
            "email": "john.doe@example.com",
            "phone": "9123456789",
            "phone_country_code": "+1",
        },
        "description": "Order #1042",
        "refunds": None,
        "disputes": None,
        "attempts": None,
        "captures": None,
        "mandate_id": None,
        "mandate_data": None,
        "setup_future_usage": None,
        "off_session": None,
        "capture_on": None,
        "capture_method": "manual" if manual else "automatic",
        "payment_method": "card",
        "payment_method_data": {
            "card": {
                "last4": "4242",
                "card_type": "CREDIT",
                "card_network": "Visa",
                "card_issuer": "STRIPE PAYMENTS UK LIMITED",
                "card_issuing_country": "UNITEDKINGDOM",
                "card_isin": "424242",
                "card_extended_bin": None,
                "card_exp_month": "03",
                "card_exp_year": "2030",
                "card_holder_name": "John Doe",
                "payment_checks": None,
                "authentication_data": None,
            },
            "billing": None,
        },
        "payment_token": None,
        "shipping": None,
        "billing": None,
        "order_details": None,
        "email": "john.doe@example.com",
        "name": "John Doe",
        "phone": "9123456789",
        "return_url": "https://shop.example.com/checkout/return",
        "authentication_type": "three_ds" if needs_action else "no_three_ds",
        "statement_descriptor_name": None,
        "statement_descriptor_suffix": None,
        "next_action": (
            {
                "type": "redirect_to_url",
                "redirect_to_url": f"https://sandbox.hyperswitch.io/payments/redirect/{object_id}",
            }
            if needs_action
            else None
        ),
        "cancellation_reason": (
            "requested_by_customer" if status in {"cancelled", "cancelled_post_capture"} else None
        ),
        "error_code": "insufficient_funds" if failed else None,
        "error_message": "Your card has insufficient funds." if failed else None,
        "unified_code": "UE_1001" if failed else None,
        "unified_message": "Insufficient funds" if failed else None,
        "error_details": (
            {
                "unified_details": {
                    "category": None,
                    "message": "Insufficient funds",
                    "standardised_code": None,
                    "description": None,
                    "user_guidance_message": None,
                    "recommended_action": None,
                },
                "issuer_details": {
                    "code": "51",
                    "message": "Insufficient funds",
                    "network_details": None,
                },
                "connector_details": {
                    "code": "card_declined",
                    "message": "Your card has insufficient funds.",
                    "reason": "insufficient_funds",
                },
            }
            if failed
            else None
        ),
        "payment_experience": None,
        "payment_method_type": "credit",
        "connector_label": None,
        "business_country": None,
        "business_label": "default",
        "business_sub_label": None,
        "allowed_payment_method_types": None,
        "manual_retry_allowed": failed,
        "connector_transaction_id": f"pi_{random_alnum(24)}",
        "frm_message": None,
        "metadata": {"order_id": "1042"},
        "connector_metadata": None,
        "feature_metadata": None,
        "reference_id": None,
        "payment_link": None,
        "profile_id": DEFAULT_PROFILE_ID,
        "surcharge_details": None,
        "attempt_count": 1,
        "merchant_decision": None,
        "merchant_connector_id": "mca_sAD3OZLATetvjLOYhUSy",
        "incremental_authorization_allowed": None,
        "authorization_count": None,
        "incremental_authorizations": None,
        "external_authentication_details": None,
        "external_3ds_authentication_attempted": False,
        "expires_on": format_timestamp(created + timedelta(minutes=15)),
        "fingerprint": None,
        "browser_info": None,
        "payment_method_id": None,
        "network_transaction_id": None,
        "payment_method_status": None,
        "updated": format_timestamp(now),
        "split_payments": None,
        "frm_metadata": None,
        "extended_authorization_applied": None,
        "capture_before": None,
        "merchant_order_reference_id": None,
        "order_tax_amount": None,
        "connector_mandate_id": None,
        "card_discovery": "manual",
        "force_3ds_challenge": False,
        "force_3ds_challenge_trigger": False,
        "issuer_error_code": "51" if failed else None,
        "issuer_error_message": "Insufficient funds" if failed else None,
        "is_iframe_redirection_enabled": None,
        "whole_connector_response": None,
    }
    return body


def refund_object(
    object_id: str,
    status: str | None,
    amount: int,
    currency: str,
    merchant_id: str,
    now: datetime,
) -> dict[str, Any]:
    failed = status == "failed"
    return {
        "refund_id": object_id,
        "payment_id": new_id("pay"),
        "amount": amount,
        "currency": currency,
        "status": status,
        "reason": "Customer returned the item",
        "metadata": {"order_id": "1042"},
        "error_message": "The refund could not be processed." if failed else None,
        "error_code": "refund_failed" if failed else None,
        "unified_code": None,
        "unified_message": None,
        "created_at": format_timestamp(now - timedelta(seconds=30)),
        "updated_at": format_timestamp(now),
        "connector": "stripe",
        "profile_id": DEFAULT_PROFILE_ID,
        "merchant_connector_id": "mca_sAD3OZLATetvjLOYhUSy",
        "split_refunds": None,
        "issuer_error_code": None,
        "issuer_error_message": None,
    }


_DISPUTE_CONNECTOR_STATUS: Final[Mapping[str, str]] = {
    "dispute_opened": "needs_response",
    "dispute_expired": "expired",
    "dispute_accepted": "lost",
    "dispute_cancelled": "warning_closed",
    "dispute_challenged": "under_review",
    "dispute_won": "won",
    "dispute_lost": "lost",
}


def dispute_object(
    object_id: str,
    status: str | None,
    amount: int,
    currency: str,
    merchant_id: str,
    now: datetime,
) -> dict[str, Any]:
    opened = now - timedelta(days=1)
    return {
        "dispute_id": object_id,
        "payment_id": new_id("pay"),
        "attempt_id": new_id("pay") + "_1",
        "amount": str(amount),
        "currency": currency,
        "dispute_stage": "dispute",
        "dispute_status": status,
        "connector": "stripe",
        "connector_status": _DISPUTE_CONNECTOR_STATUS.get(status or "", "needs_response"),
        "connector_dispute_id": f"dp_{random_alnum(24)}",
        "connector_reason": "fraudulent",
        "connector_reason_code": "10.4",
        "challenge_required_by": format_timestamp(opened + timedelta(days=7)),
        "connector_created_at": format_timestamp(opened),
        "connector_updated_at": format_timestamp(now),
        "created_at": format_timestamp(opened),
        "profile_id": DEFAULT_PROFILE_ID,
        "merchant_connector_id": "mca_sAD3OZLATetvjLOYhUSy",
        "is_already_refunded": False,
    }


def mandate_object(
    object_id: str,
    status: str | None,
    amount: int,
    currency: str,
    merchant_id: str,
    now: datetime,
) -> dict[str, Any]:
    return {
        "mandate_id": object_id,
        "status": status,
        "payment_method_id": f"pm_{secrets.token_hex(16)}",
        "payment_method": "card",
        "payment_method_type": "credit",
        "card": {
            "last4_digits": "4242",
            "card_exp_month": "03",
            "card_exp_year": "2030",
            "card_holder_name": "John Doe",
            "card_token": None,
            "scheme": "Visa",
            "issuer_country": "UNITEDKINGDOM",
            "card_fingerprint": None,
            "card_isin": "424242",
            "card_issuer": "STRIPE PAYMENTS UK LIMITED",
            "card_network": "Visa",
            "card_type": "CREDIT",
            "nick_name": None,
        },
        "customer_acceptance": {
            "acceptance_type": "online",
            "accepted_at": format_timestamp(now - timedelta(minutes=5)),
            "online": {"ip_address": "203.0.113.7", "user_agent": "Mozilla/5.0"},
        },
    }


def payout_object(
    object_id: str,
    status: str | None,
    amount: int,
    currency: str,
    merchant_id: str,
    now: datetime,
) -> dict[str, Any]:
    failed = status == "failed"
    connector_txn = f"S3FC{secrets.token_hex(6).upper()}"
    customer_id = "cus_y3oqhf46pyzuxjbcn2gi"
    return {
        "payout_id": object_id,
        "merchant_id": merchant_id,
        "merchant_order_reference_id": "payout_ref_1042",
        "amount": amount,
        "currency": currency,
        "connector": "wise",
        "payout_type": "bank",
        "payout_method_data": {
            "bank": {
                "bank_account_number": "0001****3456",
                "bank_routing_number": "110***000",
                "bank_name": None,
                "bank_country_code": "US",
                "bank_city": "California",
            }
        },
        "billing": None,
        "auto_fulfill": True,
        "customer_id": customer_id,
        "customer": {
            "id": customer_id,
            "name": "John Doe",
            "email": "john.doe@example.com",
            "phone": "9123456789",
            "phone_country_code": "+1",
        },
        "client_secret": f"{object_id}_secret_{random_alnum(20)}",
        "return_url": "https://shop.example.com/payouts/return",
        "business_country": "US",
        "business_label": None,
        "description": "Seller payout #1042",
        "entity_type": "Individual",
        "recurring": False,
        "metadata": {"seller_id": "seller_7"},
        "merchant_connector_id": "mca_sAD3OZLATetvjLOYhUSy",
        "status": status,
        "error_message": "Something went wrong" if failed else None,
        "error_code": "payout_failed" if failed else None,
        "profile_id": DEFAULT_PROFILE_ID,
        "created": format_timestamp(now - timedelta(minutes=2)),
        "connector_transaction_id": connector_txn,
        "priority": None,
        "attempts": [
            {
                "attempt_id": f"{object_id}_1",
                "status": status,
                "amount": amount,
                "currency": currency,
                "connector": "wise",
                "error_code": "payout_failed" if failed else None,
                "error_message": "Something went wrong" if failed else None,
                "payment_method": "bank",
                "payout_method_type": "ach",
                "connector_transaction_id": connector_txn,
                "cancellation_reason": None,
                "unified_code": "UE_9000" if failed else None,
                "unified_message": "Something went wrong" if failed else None,
            }
        ],
        "payout_link": None,
        "email": "john.doe@example.com",
        "name": "John Doe",
        "phone": "9123456789",
        "phone_country_code": "+1",
        "unified_code": "UE_9000" if failed else None,
        "unified_message": "Something went wrong" if failed else None,
        "payout_method_id": None,
    }


def subscription_object(
    object_id: str,
    status: str | None,
    amount: int,
    currency: str,
    merchant_id: str,
    now: datetime,
) -> dict[str, Any]:
    subscription_id = f"sub_{secrets.token_hex(16)}"
    payment_id = new_id("pay")
    customer_id = "cus_y3oqhf46pyzuxjbcn2gi"
    payment_method_id = f"pm_{secrets.token_hex(16)}"
    paid = status == "invoice_paid"
    return {
        "id": subscription_id,
        "merchant_reference_id": "plan_order_1042",
        "status": "active" if paid else "pending",
        "plan_id": "plan_monthly_basic",
        "item_price_id": "plan_monthly_basic-USD-Monthly",
        "coupon": None,
        "profile_id": DEFAULT_PROFILE_ID,
        "payment": {
            "payment_id": payment_id,
            "status": "succeeded" if paid else "processing",
            "amount": amount,
            "currency": currency,
            "profile_id": DEFAULT_PROFILE_ID,
            "connector": "stripe",
            "payment_method_id": payment_method_id,
            "return_url": None,
            "next_action": None,
            "payment_experience": None,
            "error_code": None,
            "error_message": None,
            "payment_method_type": "credit",
            "client_secret": None,
            "billing": None,
            "shipping": None,
            "payment_type": None,
            "payment_token": None,
        },
        "customer_id": customer_id,
        "invoice": {
            "id": object_id,
            "subscription_id": subscription_id,
            "merchant_id": merchant_id,
            "profile_id": DEFAULT_PROFILE_ID,
            "merchant_connector_id": "mca_billingprocessor0001",
            "payment_intent_id": payment_id,
            "payment_method_id": payment_method_id,
            "customer_id": customer_id,
            "amount": amount,
            "currency": currency,
            "status": status,
            "billing_processor_invoice_id": f"in_{random_alnum(24)}",
        },
        "billing_processor_subscription_id": f"sub_{random_alnum(24)}",
    }


ObjectBuilder: TypeAlias = Callable[[str, str | None, int, str, str, datetime], dict[str, Any]]

#: Event class to (object builder, object id prefix).
OBJECT_BUILDERS: Final[Mapping[str, tuple[ObjectBuilder, str]]] = {
    "payments": (payment_object, "pay"),
    "refunds": (refund_object, "ref"),
    "disputes": (dispute_object, "dp"),
    "mandates": (mandate_object, "man"),
    "payouts": (payout_object, "payout"),
    "subscriptions": (subscription_object, "invoice"),
}
