"""MLflow's error shape: ``{"error_code": "INVALID_PARAMETER_VALUE", "message": "..."}``
with the HTTP status MLflow gives each code (mlflow/exceptions.py,
ERROR_CODE_TO_HTTP_STATUS), which the MLflow clients turn back into their
exceptions (``RestException``)."""

from __future__ import annotations

from django.http import JsonResponse

INVALID_PARAMETER_VALUE = "INVALID_PARAMETER_VALUE"
RESOURCE_DOES_NOT_EXIST = "RESOURCE_DOES_NOT_EXIST"
RESOURCE_ALREADY_EXISTS = "RESOURCE_ALREADY_EXISTS"
UNAUTHENTICATED = "UNAUTHENTICATED"
PERMISSION_DENIED = "PERMISSION_DENIED"
ENDPOINT_NOT_FOUND = "ENDPOINT_NOT_FOUND"
BAD_REQUEST = "BAD_REQUEST"
INTERNAL_ERROR = "INTERNAL_ERROR"
TEMPORARILY_UNAVAILABLE = "TEMPORARILY_UNAVAILABLE"

HTTP_STATUS = {
    INVALID_PARAMETER_VALUE: 400,
    RESOURCE_ALREADY_EXISTS: 400,  # as MLflow answers it (not 409)
    BAD_REQUEST: 400,
    UNAUTHENTICATED: 401,
    PERMISSION_DENIED: 403,
    RESOURCE_DOES_NOT_EXIST: 404,
    ENDPOINT_NOT_FOUND: 404,
    INTERNAL_ERROR: 500,
    TEMPORARILY_UNAVAILABLE: 503,  # MLflow clients retry it
}


class MlflowError(Exception):
    """A refusal answered in MLflow's error shape; nothing was stored."""

    def __init__(self, error_code: str, message: str):
        super().__init__(message)
        self.error_code = error_code
        self.message = message

    def response(self) -> JsonResponse:
        response = JsonResponse(
            {"error_code": self.error_code, "message": self.message},
            status=HTTP_STATUS[self.error_code],
        )
        if self.error_code == UNAUTHENTICATED:
            response["WWW-Authenticate"] = 'Basic realm="lab", Bearer'
        return response


def invalid(message: str) -> MlflowError:
    return MlflowError(INVALID_PARAMETER_VALUE, message)


def missing(message: str) -> MlflowError:
    return MlflowError(RESOURCE_DOES_NOT_EXIST, message)
