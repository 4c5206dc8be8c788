"""The Responses API route (``POST /v1/responses``): its request model and translation, its handler, and the stored responses ``previous_response_id`` continues."""
