"""Forms of the dashboard. The profile form asks the model (and so the engine)
to validate, exactly as the admin does; it only adds widgets with the bounds,
tool-name lists as plain text, and the owner's unique names."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib.auth.models import User
from django.core.exceptions import FieldDoesNotExist
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from contextlab.engine.core.profile import BOUNDS, Bound, bound_problem
from contextlab.sessions.models import LIST_KNOBS, PROFILE_KNOBS, AgentProfile
from contextlab.support import providers


def _model_knobs() -> list[str]:
    # Only knobs the table has a column for (the engine may be a step ahead).
    names = []
    for name in PROFILE_KNOBS:
        try:
            AgentProfile._meta.get_field(name)
        except FieldDoesNotExist:
            continue
        names.append(name)
    return names


KNOBS = _model_knobs()

# How the form is laid out; a knob missing here lands in "Other".
FIELDSETS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("window", "Window and thresholds", ("max_input_length", "compact_ratio", "reserve_ratio", "policy",
                                         "tokenizer", "estimate_divisor", "max_message_bytes")),
    ("tools", "Tool results", ("recent_n", "recent_max_bytes", "old_max_bytes", "markdown_recent_max_bytes",
                               "markdown_old_max_bytes", "retention_days", "exempt_tool_names",
                               "browser_tool_names", "read_file_tool_names")),
    ("summary", "Summary", ("compactor", "compaction_provider", "compaction_model",
                            "compaction_timeout", "compaction_retries", "compaction_constrained_output",
                            "summary_language", "timezone")),
    ("eviction", "Eviction policy", ("eviction_strategy", "eviction_target_ratio", "eviction_weight_relevance",
                                     "eviction_weight_recency", "eviction_weight_density")),
)


class ToolNamesField(forms.CharField):
    """A list of tool names typed as text, one per line or comma separated."""

    widget = forms.Textarea(attrs={"rows": 2})

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return ", ".join(str(v) for v in value)
        return value

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = super().to_python(value) or ""
        if text.strip().startswith("["):
            # A JSON list, as the admin used to ask for, is read as one.
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
            if isinstance(parsed, list) and all(isinstance(v, str) for v in parsed):
                return [name.strip() for name in parsed if name.strip()]
        names = [part.strip() for chunk in text.splitlines() for part in chunk.split(",")]
        return [name for name in names if name]

    def validate(self, value: Any) -> None:
        for name in value:
            if len(name) > 200:
                raise forms.ValidationError("a tool name is longer than 200 characters")


def _formfield(field: models.Field[Any, Any], **kwargs: Any) -> forms.Field | None:
    # Django 6 makes https the default scheme of a URL typed without one; say so now.
    if isinstance(field, models.URLField):
        kwargs["assume_scheme"] = "https"
    return field.formfield(**kwargs)


def apply_bounds(name: str, field: forms.Field) -> None:
    """The engine's bounds on a number input: min, max, step and the help text.

    Django's FloatField is a subclass of its IntegerField, so the kind of number
    is read from the field's class, never from ``isinstance(…, IntegerField)``
    alone (that turned 0.1-0.95 into ``min=0 max=0 step=1``).
    """
    bound = BOUNDS.get(name)
    if bound is None or not isinstance(field.widget, forms.NumberInput):
        return
    integer = isinstance(field, forms.IntegerField) and not isinstance(field, forms.FloatField | forms.DecimalField)
    # One message per knob, from the engine: Django's own range checks said "≥ 0" for a
    # positive integer whose real bound is 1, and a second message beside the engine's.
    field.validators = [v for v in field.validators
                        if not isinstance(v, MinValueValidator | MaxValueValidator)] + [_BoundValidator(name)]
    field.widget.attrs.update({
        "min": int(bound.low) if integer else bound.low,
        "max": int(bound.high) if integer else bound.high,
        # Any value in bounds is valid for the engine, so the browser must not
        # reject 0.333; the arrows of a ratio still move by a hundredth.
        "step": 1 if integer else "any",
        "data-step": 1 if integer else _arrow_step(bound),
    })
    field.help_text = f"{bound.help} ({_fmt(bound.low)} to {_fmt(bound.high)})"


class _BoundValidator:
    """The engine's bound on one knob, as a form field validator."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, value: Any) -> None:
        problem = bound_problem(self.name, value) if value is not None else None
        if problem is not None:
            raise forms.ValidationError(problem.message, code="bound")


def _arrow_step(bound: Bound) -> float:
    return 0.01 if bound.high <= 1 else 0.1


class ProfileForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = AgentProfile
        fields = ["name", *KNOBS]
        formfield_callback = _formfield

    def __init__(self, *args: Any, owner: User, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.owner = owner
        for name, field in self.fields.items():
            apply_bounds(name, field)
            if name in LIST_KNOBS:
                self.fields[name] = ToolNamesField(required=False, help_text=field.help_text,
                                                   label=field.label)
        # Only the operator's providers can be chosen; a name they removed shows as it is, to be replaced.
        choices = providers.provider_choices()
        current = self.instance.compaction_provider
        if current and current not in dict(choices):
            choices.append((current, f"{current} (no longer offered)"))
        self.fields["compaction_provider"] = forms.ChoiceField(
            choices=choices, required=False, label="Compaction provider",
            help_text=self.fields["compaction_provider"].help_text)

    def clean_name(self) -> str:
        name = str(self.cleaned_data["name"]).strip()
        taken = AgentProfile.objects.filter(owner=self.owner, name=name)
        if self.instance.pk:
            taken = taken.exclude(pk=self.instance.pk)
        if taken.exists():
            raise forms.ValidationError(f"you already have a profile named {name!r}")
        return name

    def fieldsets(self) -> list[dict[str, Any]]:
        placed: set[str] = {"name"}
        groups = []
        for key, title, names in FIELDSETS:
            fields = [self[name] for name in names if name in self.fields]
            placed.update(names)
            if fields:
                groups.append({"key": key, "title": title, "fields": fields})
        rest = [self[name] for name in self.fields if name not in placed]
        if rest:
            groups.append({"key": "other", "title": "Other", "fields": rest})
        return groups

    def save(self, commit: bool = True) -> AgentProfile:
        profile: AgentProfile = super().save(commit=False)
        profile.owner = self.owner
        if commit:
            profile.save()
        return profile


def _fmt(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def derived_numbers(data: Any) -> dict[str, Any] | None:
    """Threshold and reserve from raw form input, even when other knobs are invalid."""
    try:
        window = int(str(data.get("max_input_length", "")).replace(",", ""))
        compact = float(data.get("compact_ratio", ""))
        reserve = float(data.get("reserve_ratio", ""))
    except (TypeError, ValueError):
        return None
    return {"window": window, "threshold": int(window * compact), "reserve": int(window * reserve)}
