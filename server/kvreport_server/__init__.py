"""The kvreport team server: stores bundles, groups them by failure signature, shows them.

``create_app(config=None)`` builds the Flask app; configuration comes from ``KVREPORT_*``
environment variables (``kvreport_server.config``) overlaid by ``config``. The schema is created
by Alembic (``kvreport_server.migrate.upgrade``), never by the app itself.
"""

from __future__ import annotations

from kvreport_server.app import create_app

__all__ = ["create_app"]
