"""Template access to console/present.py: ``{% load present %}``, then ``{% task_badge task as badge %}`` or
``{{ reason|attention_presentation }}`` / ``{{ reason|pause_presentation }}``."""

from typing import Any

from django import template

from console import present

register = template.Library()


@register.simple_tag
def task_badge(task: Any) -> present.Badge:
    return present.task_badge(task)


@register.filter
def attention_presentation(reason: str) -> present.Presentation:
    return present.attention(reason)


@register.filter
def pause_presentation(reason: str) -> present.Presentation:
    return present.pause_reason(reason)
