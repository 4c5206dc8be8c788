"""The FastAPI app of the gateway's HTTP adapter: :func:`build_app` and its error handlers (:mod:`.build`), its
routes (:mod:`.routes`), its middleware (:mod:`.middleware`) and the reward route (:mod:`.reward`)."""

from services.gateway.http.app.build import build_app, install_error_handlers

__all__ = ["build_app", "install_error_handlers"]
