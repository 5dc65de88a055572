"""The way out (issue #28): one proxy rule for the link, the uploads and enrollment."""
import pytest

from agent.config import load as C
from agent.base.egress import Egress, EgressError, bypasses, no_proxy_from_env, parse_no_proxy, parse_proxy, proxy_from_env

from tests.test_config import GOOD, write


@pytest.mark.parametrize("entries, host, port, direct", [
    ("*", "fleet.example.com", 443, True),
    ("example.com", "fleet.example.com", 443, True),       # a domain covers what is under it
    (".example.com", "fleet.example.com", 443, True),
    ("*.example.com", "example.com", 443, True),
    ("example.com", "badexample.com", 443, False),          # not a suffix match of the text
    ("fleet.example.com:8443", "fleet.example.com", 443, False),
    ("fleet.example.com:8443", "fleet.example.com", 8443, True),
    ("10.0.0.0/8", "10.20.30.40", 443, True),
    ("10.0.0.0/8", "11.0.0.1", 443, False),
    ("10.0.0.0/8", "ten.example.com", 443, False),         # names are not resolved to decide
    ("fd00::/8", "fd12::1", 443, True),
    ("[fd12::1]:443", "fd12::1", 443, True),
    ("127.0.0.1", "localhost", 443, False),                 # localhost is not special
    ("", "127.0.0.1", 443, False),
    ("FLEET.Example.com", "fleet.example.COM.", 443, True),
])
def test_one_rule_for_which_hosts_go_direct(entries, host, port, direct):
    assert bypasses(parse_no_proxy(entries, "t"), host, port) is direct


def test_a_proxy_url_is_parsed_with_its_credentials_decoded_and_never_shown():
    p = parse_proxy("http://site%40user:p%3Ass%20w@proxy.example:3128", "network.proxy")
    assert (p.host, p.port, p.user, p.password) == ("proxy.example", 3128, "site@user", "p:ss w")
    assert "p:ss" not in repr(p) and "p%3Ass" not in p.display
    assert p.display == "http://***@proxy.example:3128"
    assert parse_proxy("proxy.example:8080", "x").port == 8080   # as curl takes it
    assert parse_proxy("http://proxy.example", "x").port == 80
    assert p.url == "http://site%40user:p%3Ass%20w@proxy.example:3128"


@pytest.mark.parametrize("value, says", [
    ("https://proxy.example:3128", "only http:// proxies"),
    ("socks5://proxy.example:1080", "only http:// proxies"),
    ("http://proxy.example:99999", "not a proxy URL"),
    ("http://prox y.example:3128", "not a proxy URL"),
    ("http://proxy.example:3128/path", "no path"),
    ("http://u%3Ax:secretpw@proxy.example:1", "cannot contain ':'"),
    ("http://u:secret%0Apw@proxy.example:1", "printable ASCII"),
    ("http://u:secret%C3%A9@proxy.example:1", "printable ASCII"),   # latin-1 vs UTF-8
    ("http://" + "a" * 5000, "longer than"),
])
def test_a_bad_proxy_is_one_line_naming_the_key_and_never_the_password(value, says):
    with pytest.raises(EgressError) as e:
        parse_proxy(value, "network.proxy")
    assert str(e.value).startswith("network.proxy: ") and says in str(e.value)
    assert "secret" not in str(e.value)


def test_a_bad_no_proxy_entry_is_named():
    with pytest.raises(EgressError, match=r"network.no_proxy: 'exa_mple\$' is not"):
        parse_no_proxy("fleet.example.com, exa_mple$", "network.no_proxy")


def test_the_environment_is_the_fallback_and_the_server_scheme_picks_the_variable():
    env = {"https_proxy": "http://a.example:1", "HTTP_PROXY": "http://b.example:2",
           "NO_PROXY": "internal.example"}
    assert proxy_from_env(env, "https").host == "a.example"
    assert proxy_from_env(env, "http").host == "b.example"
    assert proxy_from_env({}, "https") is None
    assert no_proxy_from_env(env) == ("internal.example",)


def test_config_takes_the_network_section_first_then_the_environment(tmp_path):
    path = write(tmp_path, GOOD)
    env = {"https_proxy": "http://env.example:3128", "http_proxy": "http://env.example:3128",
           "no_proxy": "*"}
    from_env = C.load(path, env=env).server.egress
    assert from_env.proxy.host == "env.example" and from_env.proxy.source.startswith("http_proxy")
    assert from_env.no_proxy == ("*",)
    mine = C.load(path, env={**env, "EDGE_AGENT_NETWORK_PROXY": "http://u:pw@mine.example:8080",
                             "EDGE_AGENT_NETWORK_NO_PROXY": "10.0.0.0/8"}).server.egress
    assert (mine.proxy.host, mine.proxy.user, mine.no_proxy) == ("mine.example", "u", ("10.0.0.0/8",))
    # a proxy set here is not bent by the environment's list
    assert C.load(path, env={**env, "EDGE_AGENT_NETWORK_PROXY": "http://mine.example:1"}) \
        .server.egress.no_proxy == ()
    with pytest.raises(C.ConfigError, match=r"^https?_proxy \(environment\): only http://"):
        C.load(path, env={"http_proxy": "https://x.example:1"})


def test_a_client_key_others_can_read_is_refused(tmp_path):
    from tests.test_config import _client_certificate
    cert, key = _client_certificate(tmp_path)
    path = write(tmp_path, GOOD)
    env = {"EDGE_AGENT_NETWORK_CLIENT_CERT": str(cert), "EDGE_AGENT_NETWORK_CLIENT_KEY": str(key)}
    assert C.load(path, env=env).server.egress.client_key == str(key)
    key.chmod(0o644)
    with pytest.raises(C.ConfigError, match="network.client_key: readable by every user"):
        C.load(path, env=env)
    key.chmod(0o600)
    with pytest.raises(C.ConfigError, match="network.client_key: needs network.client_cert"):
        C.load(path, env={"EDGE_AGENT_NETWORK_CLIENT_KEY": str(key)})
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(C.ConfigError, match="network.client_cert: cannot be loaded"):
        C.load(path, env={"EDGE_AGENT_NETWORK_CLIENT_CERT": str(garbage)})


def test_sessions_ignore_the_environment_and_take_the_egress(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://env.example:1")
    monkeypatch.setenv("NO_PROXY", "*")
    proxy = parse_proxy("http://u:pw@proxy.example:3128", "t")
    s = Egress(proxy=proxy, no_proxy=("direct.example",), ca_file="/etc/site-ca.pem") \
        .session("https://fleet.example.com")
    assert s.trust_env is False and s.verify == "/etc/site-ca.pem"
    assert s.proxies == {"http": proxy.url, "https": proxy.url}
    assert Egress(proxy=proxy, no_proxy=("fleet.example.com",)) \
        .session("https://fleet.example.com").proxies == {}
    assert Egress().session("https://fleet.example.com").verify is True
