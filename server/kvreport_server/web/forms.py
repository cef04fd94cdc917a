"""Flask-WTF forms (CSRF-protected): sign-in and a maintainer's edit of a cluster."""

from __future__ import annotations

from flask_wtf import FlaskForm
from wtforms import PasswordField, SelectField, StringField, TextAreaField
from wtforms.validators import URL, DataRequired, Length, Optional

from kvreport_server.models import CLUSTER_STATUSES


class LoginForm(FlaskForm):
    username = StringField("User name", validators=[DataRequired(), Length(max=100)])
    password = PasswordField("Password", validators=[DataRequired(), Length(max=200)])


class ClusterForm(FlaskForm):
    known_fix = TextAreaField("Known fix (Markdown)", validators=[Optional(), Length(max=20000)])
    issue_url = StringField("GitHub issue URL", validators=[Optional(), Length(max=500),
                                                            URL(require_tld=False, message="must be an http(s) URL")])
    status = SelectField("Status", choices=list(CLUSTER_STATUSES))
