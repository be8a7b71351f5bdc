"""The SSH entry's gate (kooi.sshgate) and its description (hoststate.ssh): whose key
sshd took, and how the client's request enters the session."""

from __future__ import annotations

import json
import os

import pytest

from kooi.hoststate import HostStateError
from kooi.hoststate import ssh as ssh_state
from kooi.sshgate import SFTP_SERVER, GateError, _auth_info, person_of, plan

A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMXF8bLWPldQGM0YigOiegXdf4dXyPMHMUjrC//Yo9Ns"
B = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"


def conf(**persons):
    return ssh_state.parse(json.dumps({"login_user": "kooi-runner", "persons": persons}))


def person(*keys, project="/srv/p"):
    return {"keys": list(keys), "workflow": "shell-session", "project": project}


def test_the_key_sshd_took_names_its_person():
    c = conf(alice=person(A + " alice@laptop"), bob=person(B))
    assert person_of(c, f"publickey {A}\n") == "alice"
    assert person_of(c, f"publickey {B}\n") == "bob"


@pytest.mark.parametrize("info", ["", "password\n", "publickey ssh-ed25519 AAAAother\n",
                                  f"publickey {A}\npublickey {B}\n"])
def test_no_key_a_stranger_or_two_persons_is_refused(info):
    c = conf(alice=person(A), bob=person(B))
    with pytest.raises(GateError):
        person_of(c, info)


@pytest.mark.parametrize("doc,why", [
    ({"login_user": "r", "persons": {"alice": person(A), "bob": person(A)}}, "one person's"),
    ({"login_user": "r", "persons": {"alice": person("command=\"sh\" " + A)}}, "not an OpenSSH public key"),
    ({"login_user": "r", "persons": {"alice": person(A + "\nrestrict " + B)}}, "not an OpenSSH public key"),
    ({"login_user": "r", "persons": {"Alice!": person(A)}}, "a person is a name"),
    ({"login_user": "r", "persons": {"alice": person(A, project="rel")}}, "absolute"),
    ({"login_user": "r", "persons": {}, "extra": 1}, "unknown keys"),
])
def test_a_description_kooi_would_misread_is_refused(doc, why):
    """What reaches sshd's key file is one key a line, with no options of its own."""
    with pytest.raises(HostStateError, match=why):
        ssh_state.parse(json.dumps(doc))


@pytest.mark.parametrize("original,tty,kind,argv", [
    ("", True, "terminal", ()),
    ("", False, "shell", ("bash", "-l")),
    (SFTP_SERVER, False, "sftp", (SFTP_SERVER,)),
    ("internal-sftp", False, "sftp", (SFTP_SERVER,)),
    ("make test; echo $?", False, "command", ("bash", "-c", "make test; echo $?")),
    ("htop", True, "command", ("bash", "-c", "htop")),
    ("kooi-sshd", False, "sshd", None),
    ("kooi-sshd", True, "sshd", None),
])
def test_what_the_client_asks_for_is_how_it_enters(original, tty, kind, argv):
    e = plan(original, tty, ("bash", "-l"), (A,))
    assert e.kind == kind and e.tty == (tty and kind in ("terminal", "command"))
    if argv is not None:
        assert e.argv == argv
    else:  # the session's own sshd, given the person's keys
        assert e.argv[:2] == ("sh", "-c") and e.argv[-1] == A and "sshd -i" in e.argv[2]


def test_sshds_record_must_be_the_login_accounts_own_private_file(tmp_path):
    f = tmp_path / "sshauth"
    f.write_text(f"publickey {A}\n")
    os.chmod(f, 0o600)
    assert _auth_info({"SSH_USER_AUTH": str(f)}, os.geteuid()).startswith("publickey")
    os.chmod(f, 0o644)
    with pytest.raises(GateError):
        _auth_info({"SSH_USER_AUTH": str(f)}, os.geteuid())
    os.chmod(f, 0o600)
    with pytest.raises(GateError):
        _auth_info({"SSH_USER_AUTH": str(f)}, os.geteuid() + 1)
    link = tmp_path / "link"
    link.symlink_to(f)
    with pytest.raises(GateError):
        _auth_info({"SSH_USER_AUTH": str(link)}, os.geteuid())
    assert _auth_info({}, os.geteuid()) == ""
