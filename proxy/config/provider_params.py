"""What an upstream of kind litellm may pass to litellm beside the request: the provider's
place and sign-in settings (`provider_params`), and which of them are secrets."""

from __future__ import annotations

# The provider settings an upstream of kind litellm may pass to litellm (`provider_params`):
# where the provider is and how to sign in. Everything else litellm accepts is either the
# request's own or the proxy's to decide. Those holding secrets are masked when printed.
PROVIDER_PARAMS = frozenset(
    {
        "api_version",
        "aws_access_key_id",
        "aws_bedrock_runtime_endpoint",
        "aws_external_id",
        "aws_profile_name",
        "aws_region_name",
        "aws_role_name",
        "aws_secret_access_key",
        "aws_session_name",
        "aws_session_token",
        "aws_sts_endpoint",
        "aws_web_identity_token",
        "azure_ad_token",
        "azure_password",
        "azure_scope",
        "azure_username",
        "client_id",
        "client_secret",
        "tenant_id",
        "vertex_credentials",
        "vertex_location",
        "vertex_project",
    }
)
SECRET_PROVIDER_PARAMS = frozenset(
    {
        "aws_secret_access_key",
        "aws_session_token",
        "aws_web_identity_token",
        "azure_ad_token",
        "azure_password",
        "client_secret",
        "vertex_credentials",
    }
)
