"""Certificates for a development broker's TLS listener, made with the ``openssl`` command.

A private certificate authority (``ca.pem``, what clients trust: ``kafka.security.ca_location``)
and a broker certificate it signs for loopback (``127.0.0.1`` and ``localhost``), written as one
PEM keystore (key, certificate, CA) that Kafka reads with ``ssl.keystore.type=PEM``. For the
development broker and the tests only: the keys are not encrypted and live as long as the
directory does. Starts processes: ``openssl``.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import RingmasterError

DAYS = "3650"


@dataclass(frozen=True)
class DevCertificates:
    ca: Path  # the authority's certificate: what a client trusts
    keystore: Path  # the broker's key, certificate and the CA, PEM


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise RingmasterError("making the broker's TLS certificates needs 'openssl' and it is not on PATH "
                              "(Debian/Ubuntu: apt-get install openssl)")
    done = subprocess.run([exe, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)
    if done.returncode != 0:
        last = (done.stdout.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise RingmasterError(f"openssl {args[0]} failed making the broker's certificates: {last}")


def make_certificates(directory: Path, name: str = "ringmaster-dev") -> DevCertificates:
    """A new CA and a loopback broker certificate signed by it, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", DAYS, "-subj", f"/CN={name}-ca", cwd=directory)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
             "-subj", "/CN=localhost", cwd=directory)
    (directory / "broker.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "broker.pem", "-days", DAYS, "-extfile", "broker.ext", cwd=directory)
    keystore = directory / "broker.keystore.pem"
    # Kafka's PEM keystore: an unencrypted PKCS#8 key (what `req -nodes` writes), then the chain.
    keystore.write_text("".join((directory / f).read_text() for f in ("broker.key", "broker.pem", "ca.pem")))
    keystore.chmod(0o600)
    return DevCertificates(ca=directory / "ca.pem", keystore=keystore)
