"""Flask-WTF forms (CSRF-protected): sign-in, a maintainer's edit of a cluster, merge and unmerge."""

from __future__ import annotations

from flask_wtf import FlaskForm
from wtforms import IntegerField, PasswordField, SelectField, StringField, TextAreaField
from wtforms.validators import URL, DataRequired, Length, NumberRange, Optional

from kvreport_server.models import CLUSTER_STATUSES


class LoginForm(FlaskForm):
    username = StringField("User name", validators=[DataRequired(), Length(max=100)])
    password = PasswordField("Password", validators=[DataRequired(), Length(max=200)])


class ClusterForm(FlaskForm):
    known_fix = TextAreaField("Known fix (Markdown)", validators=[Optional(), Length(max=20000)])
    issue_url = StringField("GitHub issue URL", validators=[Optional(), Length(max=500),
                                                            URL(require_tld=False, message="must be an http(s) URL")])
    status = SelectField("Status", choices=list(CLUSTER_STATUSES))


class MergeForm(FlaskForm):
    into = IntegerField("Merge this cluster into cluster number",
                        validators=[DataRequired(message="give the number of the cluster to merge into"),
                                    NumberRange(min=1, max=2**31 - 1)])


class UnmergeForm(FlaskForm):
    """Only the CSRF token: the cluster is in the URL."""
