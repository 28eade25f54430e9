"""A throwaway certificate chain for C2PA signing tests, made with `cryptography`: a root CA and
a signing certificate it issued (EC P-256, valid for a day either side of now). c2pa wants the
signing certificate to be an end entity (not a CA) with the digitalSignature key usage and an
extended key usage it accepts (emailProtection here); a reader trusts the chain only when the
root is on its trust list (`trust_context`)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class TestChain:
    chain_pem: bytes  # signing certificate, then the root
    key_pem: bytes
    root_pem: bytes

    def write(self, directory: Path) -> tuple[Path, Path]:
        cert, key = directory / "chain.pem", directory / "key.pem"
        cert.write_bytes(self.chain_pem)
        key.write_bytes(self.key_pem)
        return cert, key

    def trust_context(self):
        """A c2pa reader context that trusts this chain's root."""
        import c2pa

        return c2pa.Context.from_dict({"trust": {"trust_anchors": self.root_pem.decode()}})


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "higgs-serve tests")])


def _usage(signs_certs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=signs_certs,
                         crl_sign=signs_certs, encipher_only=False, decipher_only=False)


def make_chain(signer_is_ca: bool = False, valid_from_days: float = -1.0,
               valid_until_days: float = 1.0) -> TestChain:
    """`signer_is_ca`: the signing certificate claims to be a CA (c2pa must refuse it).
    The signing certificate is valid from now + valid_from_days to now + valid_until_days."""
    now = datetime.datetime.now(datetime.timezone.utc)
    root_key = ec.generate_private_key(ec.SECP256R1())
    root = (x509.CertificateBuilder().subject_name(_name("test root")).issuer_name(_name("test root"))
            .public_key(root_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=400)).not_valid_after(now + datetime.timedelta(days=400))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_usage(signs_certs=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(root_key.public_key()), critical=False)
            .sign(root_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder().subject_name(_name("test signer")).issuer_name(root.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now + datetime.timedelta(days=valid_from_days))
            .not_valid_after(now + datetime.timedelta(days=valid_until_days))
            .add_extension(x509.BasicConstraints(ca=signer_is_ca, path_length=None), critical=True)
            .add_extension(_usage(signs_certs=signer_is_ca), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(root_key.public_key()), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(root_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return TestChain(leaf.public_bytes(pem) + root.public_bytes(pem),
                     key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
                     root.public_bytes(pem))
