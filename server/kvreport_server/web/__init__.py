"""Server-rendered pages (Jinja2, autoescaped, usable without JavaScript)."""

from kvreport_server.web.views import bp

__all__ = ["bp"]
