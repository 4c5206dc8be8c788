from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Codec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODEC_UNSPECIFIED: _ClassVar[Codec]
    CODEC_NONE: _ClassVar[Codec]
    CODEC_ZSTD: _ClassVar[Codec]
CODEC_UNSPECIFIED: Codec
CODEC_NONE: Codec
CODEC_ZSTD: Codec

class CompressedFrame(_message.Message):
    __slots__ = ("codec", "uncompressed_bytes", "data", "dictionary_id")
    CODEC_FIELD_NUMBER: _ClassVar[int]
    UNCOMPRESSED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DICTIONARY_ID_FIELD_NUMBER: _ClassVar[int]
    codec: Codec
    uncompressed_bytes: int
    data: bytes
    dictionary_id: int
    def __init__(self, codec: _Optional[_Union[Codec, str]] = ..., uncompressed_bytes: _Optional[int] = ..., data: _Optional[bytes] = ..., dictionary_id: _Optional[int] = ...) -> None: ...

class Payload(_message.Message):
    __slots__ = ("content_type", "data")
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    content_type: str
    data: bytes
    def __init__(self, content_type: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...
