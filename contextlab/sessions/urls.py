from __future__ import annotations

from django.urls import path

from contextlab.dashboard.views import (
    compaction,
    files,
    imports,
    profiles,
    reinject,
    search,
    summaries,
    timetravel,
    what_if,
)
from contextlab.sessions import views

urlpatterns = [
    path("", views.sessions_list, name="cl-sessions"),
    path("sessions/<uuid:session_id>/", views.session_detail, name="cl-session-detail"),
    path("sessions/<uuid:session_id>/export/", views.session_export, name="cl-session-export"),
    path("sessions/<uuid:session_id>/turns/", views.session_turns, name="cl-session-turns"),
    path("sessions/<uuid:session_id>/turns/<int:number>/", views.turn_detail, name="cl-turn-detail"),
    path("sessions/<uuid:session_id>/inspect/", views.session_inspect, name="cl-session-inspect"),
    path("sessions/<uuid:session_id>/at/", timetravel.session_at, name="cl-session-at"),
    path("sessions/<uuid:session_id>/payload/", views.session_llm, name="cl-session-llm"),
    path("sessions/<uuid:session_id>/messages/", views.session_messages, name="cl-session-messages"),
    path("sessions/<uuid:session_id>/messages/<int:seq>/", files.message_detail, name="cl-message-detail"),
    path("sessions/<uuid:session_id>/messages/<int:seq>/reinject/", reinject.message_reinject,
         name="cl-message-reinject"),
    path("sessions/<uuid:session_id>/ledger/", views.session_ledger, name="cl-session-ledger"),
    path("sessions/<uuid:session_id>/files/<path:path>", files.session_file, name="cl-session-file"),
    path("sessions/<uuid:session_id>/summaries/", summaries.session_summaries, name="cl-session-summaries"),
    path("sessions/<uuid:session_id>/search", search.session_search, name="cl-session-search"),
    path("sessions/<uuid:session_id>/compaction/preview/", compaction.compaction_preview,
         name="cl-compaction-preview"),
    path("sessions/<uuid:session_id>/compaction/", compaction.compaction_start, name="cl-compaction-start"),
    path("sessions/<uuid:session_id>/compaction/dry-run/", compaction.compaction_dry_run,
         name="cl-compaction-dry-run"),
    path("sessions/<uuid:session_id>/compaction/runs/<int:run_id>/<str:action>/", compaction.compaction_review,
         name="cl-compaction-review"),
    path("sessions/<uuid:session_id>/pins/", compaction.session_pins, name="cl-session-pins"),
    path("profiles/", profiles.profiles_list, name="cl-profiles"),
    path("profiles/new/", profiles.profile_create, name="cl-profile-create"),
    path("profiles/preview/", profiles.profile_preview, name="cl-profile-preview"),
    path("profiles/<int:profile_id>/", profiles.profile_edit, name="cl-profile-edit"),
    path("profiles/<int:profile_id>/what-if/", what_if.profile_what_if, name="cl-profile-what-if"),
    path("profiles/<int:profile_id>/what-if/<int:run_id>/", what_if.profile_what_if_run, name="cl-profile-what-if-run"),
    path("profiles/<int:profile_id>/versions/<int:number>/", what_if.profile_version, name="cl-profile-version"),
    path("import/", imports.import_start, name="cl-import"),
    path("import/<uuid:session_id>/", imports.import_progress, name="cl-import-progress"),
]
