"""The few inputs of the insight pages, with the engine's bounds."""

from __future__ import annotations

from django import forms

from contextlab.engine.core.profile import BOUNDS
from contextlab.insights.services import MAX_QUERY_CHARS, MAX_RECALL_LIMIT

OPERATION_STATUSES = (("", "all"), ("failed", "failed"), ("ok", "ok"), ("pending", "no result yet"))


class CompareForm(forms.Form):
    window = forms.IntegerField(
        required=False, min_value=int(BOUNDS["max_input_length"].low), max_value=int(BOUNDS["max_input_length"].high),
        label="Window (tokens)",
        help_text="replay with another context window; empty: the profile's",
        widget=forms.NumberInput(attrs={"placeholder": "profile's window", "step": 1000}))


class RecallForm(forms.Form):
    q = forms.CharField(required=False, max_length=MAX_QUERY_CHARS, label="Search the archive",
                        widget=forms.TextInput(attrs={"placeholder": "a path, an id, an error message, a phrase",
                                                      "autofocus": True, "type": "search"}))
    limit = forms.IntegerField(required=False, min_value=1, max_value=MAX_RECALL_LIMIT, initial=20)


class OperationsFilter(forms.Form):
    status = forms.ChoiceField(required=False, choices=OPERATION_STATUSES)
    subtask = forms.CharField(required=False, max_length=400)
