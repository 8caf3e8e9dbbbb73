"""Typed errors with messages meant for people. The app shows ``str(err)`` as is."""


class EngineError(ValueError):
    """Base class: bad input or an impossible request. The engine stays usable after one."""


class NoPairError(EngineError):
    """No draft/target pair is loaded yet."""


class UnknownModelError(EngineError):
    pass


class IncompatiblePairError(EngineError):
    pass


class InvalidSettingError(EngineError):
    """A setting out of its range. ``setting`` names it when one setting is at fault (e.g. a SamplingConfig
    field), so that an API can name its own parameter."""

    def __init__(self, message: str, setting: str | None = None):
        super().__init__(message)
        self.setting = setting


class EmptyPromptError(EngineError):
    pass


class PromptTooLongError(EngineError):
    pass


class ModelFormatError(EngineError):
    """A model file is not what its name says (e.g. a ``.gguf`` that is not GGUF)."""


class ModelIntegrityError(EngineError):
    """An assembled model file does not match its published checksum."""


class DeviceOutOfMemoryError(EngineError):
    """The GPU ran out of memory; the message gives the model sizes and what to choose instead."""


class MissingDependencyError(EngineError):
    """A precision needs a package that is not installed (bitsandbytes for nf4 and int8)."""
