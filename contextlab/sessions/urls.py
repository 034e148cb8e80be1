from __future__ import annotations

from django.urls import path

from contextlab.sessions import views

urlpatterns = [
    path("", views.sessions_list, name="cl-sessions"),
    path("sessions/<uuid:session_id>/", views.session_detail, name="cl-session-detail"),
    path("sessions/<uuid:session_id>/export/", views.session_export, name="cl-session-export"),
    path("sessions/<uuid:session_id>/turns/<int:number>/", views.turn_detail, name="cl-turn-detail"),
]
