"""What the gateway's API surfaces share: one generation and one chat call, the episode context, detokenization,
the shared request fields, named server-sent events, the tool shapes and the error answers."""
