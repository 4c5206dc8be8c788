"""A team's behaviour: workflows (roles, prompts, parsers, who acts when, rewards) and system prompt
templates."""
