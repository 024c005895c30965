"""BrokerConfig: the broker's own settings (the store's are in MessageStoreConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BrokerConfig:
    """Broker settings with RocketMQ's names and defaults."""

    broker_name: str = "broker-a"
    host: str = "127.0.0.1"
    port: int = 0
    auto_create_topic_enable: bool = False
    default_topic_queue_nums: int = 4
    long_polling_enable: bool = True
    max_pull_batch_size: int = 100_000  # messages per pull
    flush_consumer_offset_interval: int = 1_000
    enable_property_filter: bool = False
    transaction_timeout: int = 6_000  # ms before a half message is first checked back
    transaction_check_interval: int = 60_000  # ms between check-backs
    transaction_check_max: int = 15
    # apache.rocketmq.v2 (RocketMQ 5 clients): shortest invisible duration of a receive (proxy's default)
    min_invisible_time_mills_for_recv: int = 10_000
    # bytes of pull answers one connection may leave unread before its pulls are answered SYSTEM_BUSY
    max_pull_bytes_in_flight_per_client: int = 256 * 1024 * 1024
    # ACL 2.0 (RocketMQ 5's authenticationEnabled / authorizationEnabled / initAuthenticationUser)
    authentication_enabled: bool = False
    authorization_enabled: bool = False
    init_authentication_user: str | None = field(default=None, repr=False)  # "USER:PASSWORD", a Super user
    authentication_clock_skew_ms: int = 300_000  # how old (or ahead) a signature's date-time may be
    # TLS: the broker's certificate chain and key (PEM); a client CA makes it mutual TLS
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be 0..65535 (0 picks a free one), got {self.port}")
        if not 1 <= self.default_topic_queue_nums <= 1024:
            raise ValueError(
                f"defaultTopicQueueNums must be 1..1024, got {self.default_topic_queue_nums}"
            )
        if self.authorization_enabled and not self.authentication_enabled:
            raise ValueError(
                "authorization_enabled needs authentication_enabled: an ACL decides on the user "
                "that signed the request (--authentication-enabled --authorization-enabled)"
            )
        if self.init_authentication_user is not None:
            user, sep, password = self.init_authentication_user.partition(":")
            if not sep or not user or not password:
                raise ValueError("init_authentication_user must be 'USER:PASSWORD' (both non-empty)")
        if self.authentication_clock_skew_ms <= 0:
            raise ValueError(
                f"authentication_clock_skew_ms must be > 0, got {self.authentication_clock_skew_ms}"
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together (--tls-cert-file --tls-key-file)")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file (mutual TLS) needs tls_cert_file and tls_key_file")
