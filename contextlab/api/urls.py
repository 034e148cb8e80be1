from __future__ import annotations

from django.urls import path, re_path

from contextlab.api import views

urlpatterns = [
    path("openapi.json", views.openapi, name="cl-api-openapi"),
    path("sessions", views.sessions, name="cl-api-sessions"),
    path("sessions/<uuid:session_id>", views.session_detail, name="cl-api-session"),
    path("sessions/<uuid:session_id>/messages", views.session_messages, name="cl-api-messages"),
    path("sessions/<uuid:session_id>/prepare", views.session_prepare, name="cl-api-prepare"),
    path("sessions/<uuid:session_id>/usage", views.session_usage, name="cl-api-usage"),
    path("sessions/<uuid:session_id>/compact", views.session_compact, name="cl-api-compact"),
    path("sessions/<uuid:session_id>/runs/<int:run_id>", views.session_run, name="cl-api-run"),
    *(path(f"sessions/<uuid:session_id>/runs/<int:run_id>/{action}", views.session_run_action, {"action": action},
           name=f"cl-api-run-{action}") for action in ("accept", "discard", "cancel")),
    path("sessions/<uuid:session_id>/dry-runs", views.session_dry_runs, name="cl-api-dry-runs"),
    path("sessions/<uuid:session_id>/pins", views.session_pins, name="cl-api-pins"),
    path("sessions/<uuid:session_id>/turns", views.session_turns, name="cl-api-turns"),
    path("sessions/<uuid:session_id>/turns/<int:number>", views.session_turn, name="cl-api-turn"),
    path("sessions/<uuid:session_id>/summaries", views.session_summaries, name="cl-api-summaries"),
    path("sessions/<uuid:session_id>/export", views.session_export, name="cl-api-export"),
    path("imports", views.imports, name="cl-api-imports"),
    path("profiles", views.profiles, name="cl-api-profiles"),
    # Anything else under /api/v1/ answers JSON, not the HTML 404 page.
    re_path(r"^(?P<rest>.*)$", views.not_found),
]
