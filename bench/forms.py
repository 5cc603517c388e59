"""The `forms` task of `infernix bench spec`: ten JSON Schemas with long keys and enums.

Grammar drafts pay off where a schema forces much text: long property names, enum values that
are decided after a few characters, nested objects with fixed layout. Each form is a schema and a
short message holding its answers; request i of a round fills form i % 10.
"""

from __future__ import annotations


def _enum(*values: str) -> dict:
    return {"enum": list(values)}


def _obj(props: dict) -> dict:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


_S, _I, _B = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}

FORMS: list[tuple[dict, str]] = [
    (_obj({"customer_account_identifier": _S, "preferred_contact_channel":
           _enum("electronic_mail", "telephone_call", "postal_letter"),
           "marketing_communication_consent": _B}),
     "Account AC-99812 wants to be contacted by telephone and does not consent to marketing."),
    (_obj({"shipment_tracking_reference": _S, "current_delivery_status":
           _enum("awaiting_collection", "in_transit_to_destination", "delivered_to_recipient",
                 "returned_to_sender"), "number_of_delivery_attempts": _I}),
     "Parcel TRK-55-0192 is in transit after 2 delivery attempts."),
    (_obj({"incident_severity_classification": _enum("informational", "minor_degradation",
                                                     "major_outage", "critical_data_loss"),
           "affected_service_component": _S, "customer_facing_impact": _B}),
     "The payments API had a major outage; customers were affected."),
    (_obj({"applicant_full_legal_name": _S, "employment_status_category":
           _enum("full_time_employee", "part_time_employee", "self_employed", "unemployed"),
           "annual_gross_income_in_euros": _I}),
     "Clara Jensen is self-employed and earns 54000 euros a year."),
    (_obj({"reservation_confirmation_code": _S, "accommodation_room_category":
           _enum("standard_double_room", "deluxe_king_suite", "family_apartment"),
           "breakfast_included_in_rate": _B, "number_of_nights_booked": _I}),
     "Booking HX7Q2 is a deluxe king suite for 3 nights, breakfast included."),
    (_obj({"vehicle_identification_number": _S, "insurance_coverage_level":
           _enum("third_party_only", "third_party_fire_and_theft", "fully_comprehensive"),
           "previous_claims_in_last_five_years": _I}),
     "VIN WVWZZZ1JZXW000001 needs fully comprehensive cover; one claim in five years."),
    (_obj({"support_ticket_priority_level": _enum("low_priority", "normal_priority",
                                                  "high_priority", "urgent_escalation"),
           "product_area_affected": _enum("billing_and_invoices", "user_authentication",
                                          "data_export_tools"),
           "reproducible_by_support_engineer": _B}),
     "Urgent: users cannot log in (authentication); support could reproduce it."),
    (_obj({"medication_prescription_identifier": _S, "dosage_administration_route":
           _enum("oral_tablet", "intravenous_infusion", "topical_application"),
           "daily_dosage_in_milligrams": _I}),
     "Prescription RX-4471: oral tablets, 400 milligrams a day."),
    (_obj({"conference_session_title": _S, "session_presentation_format":
           _enum("keynote_presentation", "panel_discussion", "hands_on_workshop"),
           "expected_attendee_count": _I, "recording_permission_granted": _B}),
     "The workshop 'Fast Parsers' expects 40 attendees and may be recorded."),
    (_obj({"warehouse_inventory_location": _obj({"storage_aisle_number": _I,
                                                 "shelf_level_designation":
                                                 _enum("ground_level", "middle_level",
                                                       "top_level")}),
           "stock_keeping_unit_code": _S, "reorder_threshold_reached": _B}),
     "SKU BX-200 sits in aisle 14 on the top level shelf; it must be reordered."),
]


def form_prompts(count: int) -> tuple[list[str], list[dict]]:
    """`count` messages (form i % 10 each) and their schemas."""
    import json

    prompts, schemas = [], []
    for i in range(count):
        schema, message = FORMS[i % len(FORMS)]
        prompts.append(f"Fill in this form as JSON.\n\nForm (JSON Schema): {json.dumps(schema)}"
                       f"\n\nMessage: {message}")
        schemas.append(schema)
    return prompts, schemas
