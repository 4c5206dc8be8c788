"""System prompt templates (``agents.N.prompt_template``, ``workflow.roles.N.system_prompt``,
:class:`marti.team.workflow.Role`'s ``system_prompt``): the placeholders they may name, the check made when a config
loads, and the one function that fills them in.

A template names the agent only: ``{name}``, ``{role}`` and ``{capabilities}``. A dataset row's columns are not
placeholders; a row reaches an agent as its user message (``dataset.input_key``, or the column
``environment.options.agent_inputs`` gives the agent). A literal brace is written twice (``{{``, ``}}``), as in
Python's ``str.format``.
"""

from __future__ import annotations

import string

__all__ = ["PROMPT_FIELDS", "check_prompt_template", "fill_prompt_template"]

#: The placeholders a system prompt template may name.
PROMPT_FIELDS = ("name", "role", "capabilities")


def check_prompt_template(template: str) -> str:
    """Check that ``template`` fills in with :func:`fill_prompt_template`: well-formed braces, and every
    placeholder one of :data:`PROMPT_FIELDS` by its plain name (no position ``{}``, attribute or index), and
    format specs literal (no placeholder nested in one).

    Args:
        template: The template text.

    Returns:
        ``template`` unchanged.

    Raises:
        ValueError: Naming the bad placeholder (and the ones allowed) or the brace problem; pydantic reports it
            against the config key.
    """
    allowed = ", ".join("{" + f + "}" for f in PROMPT_FIELDS)
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ValueError(
            f"the template's braces do not pair up ({exc}); write a literal brace as '{{{{' or '}}}}'"
        ) from None
    for _, field, spec, _ in string.Formatter().parse(template):
        if spec and "{" in spec:  # filled in from another placeholder: no longer a spec this check can judge
            inner = next((f for _, f, _, _ in string.Formatter().parse(spec) if f is not None), spec)
            raise ValueError(
                f"placeholder {{{inner}}} inside the format spec of {{{field}}}: a format spec must be literal "
                "text (as in '{name:>10}'); write a literal brace as '{{' or '}}'"
            )
    for field in fields:
        if field not in PROMPT_FIELDS:
            raise ValueError(
                f"placeholder {{{field}}} is not one of {allowed}: a system prompt template names the agent only "
                "(a dataset row's columns reach the agent as its user message: dataset.input_key, or "
                "environment.options.agent_inputs); write a literal brace as '{{' or '}}'"
            )
    try:
        fill_prompt_template(template, name="", role="", capabilities="")
    except (ValueError, TypeError) as exc:  # a format spec or conversion the text cannot take
        raise ValueError(f"the template cannot be filled in: {exc}") from None
    return template


def fill_prompt_template(template: str, *, name: str, role: str, capabilities: str) -> str:
    """``template`` with ``{name}``, ``{role}`` and ``{capabilities}`` filled in (``str.format``).

    Args:
        template: A template :func:`check_prompt_template` accepts.
        name: The agent's name.
        role: Its role.
        capabilities: Its capabilities, comma-separated.

    Returns:
        The system prompt.
    """
    return template.format(name=name, role=role, capabilities=capabilities)
