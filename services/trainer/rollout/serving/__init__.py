"""What the inference gateway serves from: backends over a job's actors or an in-process engine, and the chat
template's ids after an assistant turn."""
