from __future__ import annotations

from django.urls import include, path

from contextlab.insights import views

urlpatterns = [
    path("api/v1/", include("contextlab.insights.api_urls")),
    path("sessions/<uuid:session_id>/insights/memory/", views.session_memory, name="cl-insights-memory"),
    path("sessions/<uuid:session_id>/insights/memory/consolidate/", views.session_memory_consolidate,
         name="cl-insights-memory-consolidate"),
    path("sessions/<uuid:session_id>/insights/operations/", views.session_operations, name="cl-insights-operations"),
    path("sessions/<uuid:session_id>/insights/stale/", views.session_stale, name="cl-insights-stale"),
    path("sessions/<uuid:session_id>/insights/compare/", views.session_compare, name="cl-insights-compare"),
    path("sessions/<uuid:session_id>/insights/compare/run/", views.session_compare_run,
         name="cl-insights-compare-run"),
    path("sessions/<uuid:session_id>/insights/recall", views.session_recall, name="cl-insights-recall"),
    path("profiles/<int:profile_id>/memory/", views.profile_memory, name="cl-profile-memory"),
    path("profiles/<int:profile_id>/memory/consolidate/", views.profile_memory_consolidate,
         name="cl-profile-memory-consolidate"),
]
