from __future__ import annotations

from django.urls import path

from contextlab.insights import api

# Mounted under /api/v1/ by contextlab.insights.urls.
urlpatterns = [
    path("sessions/<uuid:session_id>/recall", api.session_recall, name="cl-api-recall"),
]
