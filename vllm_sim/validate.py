"""Request-field validation as vLLM's OpenAI server does it (measured against vLLM 0.32's CPU build). Pure.

Two kinds of 400, as vLLM has them:
* schema errors (pydantic's): a field of the wrong type, a required field missing, a body that is not a JSON
  object: ``type "Bad Request"``, ``param "body.<field>"`` (:func:`schema_error`);
* semantic errors (vLLM's own checks on well-typed values): ``type "BadRequestError"``, ``param`` the field.

Coercion is pydantic's lax mode: ``"5"`` is an int, ``"yes"`` a bool, ``"0.5"`` a float; ``"hot"`` is none.
"""

from __future__ import annotations

from typing import Any

from vllm_sim.openai_api import ApiError

_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_FLOATS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
_INTS = ("seed", "top_k", "n", "min_tokens", "max_tokens", "max_completion_tokens", "top_logprobs",
         "truncate_prompt_tokens")  # fmt: skip
_BOOLS = ("stream", "ignore_eos", "echo", "add_special_tokens", "skip_special_tokens", "add_generation_prompt",
          "continue_final_message")  # fmt: skip


def schema_error(field: str, message: str) -> ApiError:
    """pydantic's form: ``"1 validation error: ..."``, type ``Bad Request``, param ``body.<field>``."""
    loc = "body" if not field else f"body.{field}"
    return ApiError(400, f"1 validation error:\n  {loc}: {message}", param=loc, schema=True)


def lax_bool(value: Any, field: str) -> bool:
    """pydantic's lax bool: bools, 0/1, and the strings true/false/yes/no/on/off/t/f/y/n/1/0."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise schema_error(field, "Input should be a valid boolean")


def lax_int(value: Any, field: str) -> int:
    """pydantic's lax int: ints, integral floats, and strings of an integer."""
    if isinstance(value, int):  # bool included: pydantic reads True as 1
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return int(_from_str(value, int, field, "Input should be a valid integer"))


def lax_float(value: Any, field: str) -> float:
    """pydantic's lax float: numbers and strings of a number."""
    if isinstance(value, int | float):
        return float(value)
    return float(_from_str(value, float, field, "Input should be a valid number"))


def _from_str(value: Any, parse: type[int] | type[float], field: str, message: str) -> float:
    """``parse`` a string value (surrounding spaces allowed); anything else is the schema error."""
    if isinstance(value, str):
        try:
            return parse(value.strip())
        except ValueError:
            pass
    raise schema_error(field, message)


def coerce_fields(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    """A copy of ``body`` with typed fields coerced (lax) and checked; raises ``ApiError`` (schema kind)."""
    out = dict(body)
    for key in _FLOATS:
        if out.get(key) is not None:
            out[key] = lax_float(out[key], key)
    for key in _INTS:
        if out.get(key) is not None:
            out[key] = lax_int(out[key], key)
    for key in _BOOLS:
        if out.get(key) is not None:
            out[key] = lax_bool(out[key], key)
    stop = out.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
        isinstance(stop, list) and all(isinstance(s, str) for s in stop)
    ):  # fmt: skip
        raise schema_error("stop", "Input should be a valid string or a list of strings")
    if chat:
        _check_chat_schema(out)
    return out


def _check_chat_schema(body: dict[str, Any]) -> None:
    if "messages" not in body:
        raise schema_error("messages", "Field required")
    if not isinstance(body["messages"], list):
        raise schema_error("messages", "Input should be a valid list")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise schema_error("tools", "Input should be a valid list")


def check_sampling(body: dict[str, Any]) -> None:
    """vLLM's checks on well-typed sampling fields; raises ``ApiError`` (semantic kind, param = the field)."""
    top_p = body.get("top_p")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ApiError(400, f"top_p must be in (0, 1], got {top_p}.", param="top_p")
    temperature = body.get("temperature")
    if temperature is not None and temperature < 0.0:
        raise ApiError(400, f"temperature must be non-negative, got {temperature}.", param="temperature")
    top_k = body.get("top_k")
    if top_k is not None and top_k < -1:
        raise ApiError(400, f"top_k must be -1 (disable), or at least 1, got {top_k}.", param="top_k")


_TOOL_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def _tool_error(message: str, param: str) -> ApiError:
    """vLLM's ``VLLMValidationError``: its message carries ``(parameter=...)``, as ``str()`` of it does."""
    return ApiError(400, f"{message} (parameter={param})", param=param)


def check_tool_choice(body: dict[str, Any]) -> None:
    """vLLM's ``ChatCompletionRequest.check_tool_usage`` (runs with the schema, whatever the server's flags):
    ``tools`` not empty, ``tool_choice`` needs ``tools``, is ``"none"``/``"auto"``/``"required"`` or names one of
    ``tools``. Raises ``ApiError`` (semantic kind, message and param as vLLM 0.32 has them)."""
    tools = body.get("tools")
    if tools == []:
        raise _tool_error("`tools` must not be an empty array. Either provide at least one tool or omit the field "
                          "entirely.", "tools")  # fmt: skip
    choice = body.get("tool_choice")
    if choice is None or choice == "none":
        return
    if tools is None:
        raise _tool_error("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if not isinstance(choice, dict):
        if choice not in ("auto", "required"):
            raise _tool_error(f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" or '
                              '"required" are supported.', "tool_choice")  # fmt: skip
        return
    function = choice.get("function")
    if not isinstance(function, dict):
        raise _tool_error(f"Invalid value for `function`: `{function}` in `tool_choice`! {_TOOL_USAGE}",
                          "tool_choice.function")  # fmt: skip
    if "name" not in function:
        raise _tool_error(f"Expected field `name` in `function` in `tool_choice`! {_TOOL_USAGE}",
                          "tool_choice.function.name")  # fmt: skip
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise _tool_error(f"Invalid `name` in `function`: `{name}` in `tool_choice`! {_TOOL_USAGE}",
                          "tool_choice.function.name")  # fmt: skip
    names = {(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)}
    if name not in names:
        raise _tool_error("The tool specified in `tool_choice` does not match any of the specified `tools`",
                          "tool_choice")  # fmt: skip


def check_tool_parsing(body: dict[str, Any], enabled: bool) -> None:
    """Without a tool parser (``--enable-auto-tool-choice --tool-call-parser NAME`` not both given), vLLM 0.32
    refuses every chat request whose ``tool_choice`` is not ``"none"`` or null: ``"auto"`` (also the default when
    ``tools`` is given) and ``"required"`` or a named tool alike (``OnlineRenderer.render_chat``, after the model
    check, before rendering; 400, ``param`` null). Call after :func:`check_tool_choice`."""
    if enabled:
        return
    choice = body.get("tool_choice", "auto" if body.get("tools") else "none")
    if choice is None or choice == "none":
        return
    if choice == "auto":
        raise ApiError(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
    what = f'function "{choice["function"]["name"]}"' if isinstance(choice, dict) else f'"{choice}"'
    raise ApiError(400, f"tool_choice={what} requires --tool-call-parser to be set")
