"""The keyed streams are the documented construction ``aes256-cbcmac-v1``, block by block.

``transforms/randomness/keyed_random.py`` draws a whole batch with a few vectorised AES calls
(``transforms/randomness/block_prf.py``). This module writes the construction out again the slow
way -- one cipher call per 16-byte block, the CBC chaining as explicit byte XORs, every
key derivation by hand (module docstring of keyed_random, docs/privacy_testing.md "Keyed
randomness") -- and checks the fast code against it for every stream group: user
identity words, (user, key) pairs, key texts, a caller's own user column, named streams,
and the later blocks the samplers' slow paths ask for. The one-block cipher call is
itself checked against the published AES-256 known-answer vectors (FIPS 197 Appendix
C.3; NIST SP 800-38A F.1.5 ECB-AES256 and F.2.5 CBC-AES256), so an error in the
reference cannot hide one in the fast code.

Deterministic: fixed test secrets, no randomness in the checks.
"""
import hashlib

import numpy as np
import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from thresher.transforms.randomness import block_prf, keyed_random

SECRET = b"keyed construction test secret.."


def aes_block(key, block):
    """AES-256 of one 16-byte block: one cipher call."""
    assert len(key) == 32 and len(block) == 16
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return enc.update(block) + enc.finalize()


def xor(a, b):
    return bytes(x ^ y for x, y in zip(a, b))


def cbc_mac(key, blocks):
    """CBC-MAC, chaining written out: s = 0; s = E(s xor m) for each block m."""
    state = bytes(16)
    for block in blocks:
        state = aes_block(key, xor(state, block))
    return state


# ---- the reference's cipher call against the standards --------------------------------------

def test_aes256_single_block_matches_fips197_appendix_c3():
    key = bytes.fromhex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
    plain = bytes.fromhex("00112233445566778899aabbccddeeff")
    assert aes_block(key, plain).hex() == "8ea2b7ca516745bfeafc49904b496089"


SP800_38A_KEY = bytes.fromhex("603deb1015ca71be2b73aef0857d7781"
                              "1f352c073b6108d72d9810a30914dff4")
SP800_38A_PLAIN = [bytes.fromhex(h) for h in (
    "6bc1bee22e409f96e93d7e117393172a", "ae2d8a571e03ac9c9eb76fac45af8e51",
    "30c81c46a35ce411e5fbc1191a0a52ef", "f69f2445df4f9b17ad2b417be66c3710")]


def test_aes256_ecb_matches_sp800_38a_f15():
    want = ["f3eed1bdb5d2a03c064b5a7e3db181f8", "591ccb10d410ed26dc5ba74a31362870",
            "b6ed21b99ca6f4f9f153e7b1beafed1d", "23304b7a39f9f3ff067d8d8f9e24ecc7"]
    assert [aes_block(SP800_38A_KEY, p).hex() for p in SP800_38A_PLAIN] == want
    # and the vectorised call: the four blocks as one (4, 2) array of little-endian words
    words = np.frombuffer(b"".join(SP800_38A_PLAIN), dtype="<u8").reshape(4, 2)
    out = block_prf.encrypt(block_prf.encryptor(SP800_38A_KEY), words)
    assert out.astype("<u8").tobytes().hex() == "".join(want)


def test_cbc_chaining_matches_sp800_38a_f25():
    """The reference's chaining (explicit XOR, one block per call) is CBC: with the IV
    as the first XOR it gives the standard's CBC-AES256 ciphertext."""
    iv = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
    want = ["f58c4c04d6e5f1ba779eabfb5f7bfbd6", "9cfc4e967edb808d679f777bc6702c7d",
            "39f23369a9d9bacfa530e26304231461", "b2eb05e2c39be9fcda6c19078c6a9d1b"]
    state, got = iv, []
    for block in SP800_38A_PLAIN:
        state = aes_block(SP800_38A_KEY, xor(state, block))
        got.append(state.hex())
    assert got == want
    # cbc_chain (vectorised, zero IV) over rows of several blocks is the same chaining
    first = xor(iv, SP800_38A_PLAIN[0])
    rows = [np.frombuffer(b, dtype="<u8").reshape(1, 2).repeat(3, axis=0)
            for b in (first, *SP800_38A_PLAIN[1:])]
    out = block_prf.cbc_chain(block_prf.encryptor(SP800_38A_KEY), *rows)
    assert out.astype("<u8")[2].tobytes().hex() == want[-1]


# ---- the construction, written out -----------------------------------------------------------

def stage_key(secret, stage):
    return hashlib.shake_256(b"thresher-stage" + len(secret).to_bytes(2, "little") + secret
                             + stage.encode("utf-8")).digest(64)


def subkey(secret, stage, label):
    return hashlib.shake_256(b"thresher/aes256-cbcmac-v1\x00" + stage_key(secret, stage)
                             + label.encode("utf-8")).digest(32)


def text_identity(key, text):
    """Prefix-free CBC-MAC: ``"thr:txt\\0" || len`` then the text, zero-padded."""
    message = b"thr:txt\x00" + len(text).to_bytes(8, "little") + text + bytes(-len(text) % 16)
    return cbc_mac(key, [message[i:i + 16] for i in range(0, len(message), 16)])


def counter(b):
    return b.to_bytes(8, "little") + bytes(8)


def stream_words(key, identity_blocks, n_words):
    """Words 0..n-1 of the stream: block b = CBC-MAC(identity blocks, <b>), two
    little-endian words per block."""
    out = []
    for b in range((n_words + 1) // 2):
        block = cbc_mac(key, [*identity_blocks, counter(b)])
        out += [int.from_bytes(block[:8], "little"), int.from_bytes(block[8:], "little")]
    return out[:n_words]


def user_block(hi, lo):
    return int(hi).to_bytes(8, "little") + int(lo).to_bytes(8, "little")


def draw_words(view, n_words):
    """n_words words of every row of a view, in stream order: (rows, n_words)."""
    return np.stack([view.element_words(len(view)) for _ in range(n_words)], axis=1)


N_WORDS = 7      # four blocks: the first block and three the slow paths would ask for


def test_named_stream_is_the_reference():
    got = keyed_random.KeyedSource(SECRET).stream("Stage/Choose", b"").bits(N_WORDS)
    ident = text_identity(subkey(SECRET, "Stage/Choose", "rows:text"), b"")
    want = stream_words(subkey(SECRET, "Stage/Choose", "rows:text:2"), [ident], N_WORDS)
    assert [int(w) for w in got] == want


def test_row_streams_of_texts_are_the_reference_and_the_named_streams():
    ids = [b"", b"a", b"x" * 15, b"y" * 16, b"z" * 40, "caf\u00e9".encode()]
    view = keyed_random.KeyedSource(SECRET).rows("S", ids).view
    got = draw_words(view, N_WORDS)
    text_key, stream_key = subkey(SECRET, "S", "rows:text"), subkey(SECRET, "S", "rows:text:2")
    for row, identity in enumerate(ids):
        want = stream_words(stream_key, [text_identity(text_key, identity)], N_WORDS)
        assert [int(w) for w in got[row]] == want
        assert [int(w) for w in keyed_random.KeyedSource(SECRET).stream("S", identity).bits(
            N_WORDS)] == want


def _users_table():
    rng = np.random.default_rng(5)
    words = rng.integers(0, 1 << 64, size=(6, 2), dtype=np.uint64)
    words[1] = [0, 0]
    words[2] = [(1 << 64) - 1, 1]
    return pa.table({"__user": words[:, 0], "__user_lo": words[:, 1],
                     "word": ["k", "", None, "k", "long key " * 5, "k"],
                     "n": pa.array([1, 2, 3, None, 5, 6], pa.int64())})


def test_user_streams_are_the_reference_over_the_identity_words():
    table = _users_table()
    source = keyed_random.StageSource(keyed_random.KeyedSource(SECRET), "Bound")
    got = draw_words(keyed_random.bind_users(source, table, ["word"]).rows(
        np.arange(table.num_rows), "user"), N_WORDS)
    key = subkey(SECRET, "Bound", "user:id:2")
    hi, lo = table.column("__user").to_pylist(), table.column("__user_lo").to_pylist()
    for row in range(table.num_rows):
        assert [int(w) for w in got[row]] == stream_words(key, [user_block(hi[row], lo[row])],
                                                          N_WORDS)
    # the fast entry points: identity words as an (n, 2) array or fixed_size_binary(16)
    words = np.stack([np.array(hi, np.uint64), np.array(lo, np.uint64)], axis=1)
    packed = pa.array([user_block(h, l) for h, l in zip(hi, lo)], pa.binary(16))
    for identities in (words, packed, pa.chunked_array([packed.slice(0, 2), packed.slice(2)])):
        view = keyed_random.KeyedSource(SECRET).rows("Bound", identities).view
        assert (draw_words(view, N_WORDS) == got).all()


def test_pair_streams_are_the_reference_over_user_and_key_text():
    table = _users_table()
    source = keyed_random.StageSource(keyed_random.KeyedSource(SECRET), "Bound")
    index = np.array([5, 0, 3, 2, 1, 4, 0])          # any subset, order and repeats
    got = draw_words(keyed_random.bind_users(source, table, ["word", "n"]).rows(index, "pair"),
                     N_WORDS)
    text_key, stream_key = subkey(SECRET, "Bound", "pair:text"), subkey(SECRET, "Bound",
                                                                         "pair:id+text:3")
    hi, lo = table.column("__user").to_pylist(), table.column("__user_lo").to_pylist()
    texts = keyed_random.row_identities(table, ["word", "n"])
    assert texts[0] == b"1:k|1:1" and texts[2] == b"N|1:3" and texts[3] == b"1:k|N"
    for i, row in enumerate(index):
        ident = [user_block(hi[row], lo[row]), text_identity(text_key, texts[row])]
        assert [int(w) for w in got[i]] == stream_words(stream_key, ident, N_WORDS)


def test_key_streams_are_the_reference_over_the_key_text():
    keys = pa.table({"word": ["b", "a", "b", None], "n": pa.array([1, 1, 1, 2], pa.int8()),
                     "count": pa.array([5, 6, 7, 8], pa.int64())})
    view = keyed_random.table_streams(keyed_random.KeyedSource(SECRET), None, "Release", keys,
                                      ["word", "n"])
    got = draw_words(view, N_WORDS)
    text_key, stream_key = subkey(SECRET, "Release", "rows:text"), subkey(SECRET, "Release",
                                                                           "rows:text:2")
    for row, text in enumerate(keyed_random.row_identities(keys, ["word", "n"])):
        want = stream_words(stream_key, [text_identity(text_key, text)], N_WORDS)
        assert [int(w) for w in got[row]] == want
    assert (got[0] == got[2]).all() and not (got[0] == got[1]).any()


def test_a_callers_own_user_column_is_maced_to_128_bits():
    table = pa.table({"uid": ["alice", "bob", "alice"], "word": ["k", "k", "j"]})
    source = keyed_random.StageSource(keyed_random.KeyedSource(SECRET), "Clip")
    got = draw_words(keyed_random.bind_users(source, table, user_column="uid").rows(
        np.arange(3), "user"), N_WORDS)
    text_key, stream_key = subkey(SECRET, "Clip", "user:text"), subkey(SECRET, "Clip",
                                                                        "user:text:2")
    for row, text in enumerate([b"5:alice", b"3:bob", b"5:alice"]):
        want = stream_words(stream_key, [text_identity(text_key, text)], N_WORDS)
        assert [int(w) for w in got[row]] == want


def test_streams_use_the_identity_word_never_the_grouping_code():
    """Where ``exact_users`` made ``__user`` a grouping code, word 0 is ``__user_hi``."""
    table = _users_table()
    grouped = table.append_column("__user_hi", table.column("__user")).set_column(
        0, "__user", pa.array(np.arange(table.num_rows, dtype=np.uint64)))
    source = keyed_random.StageSource(keyed_random.KeyedSource(SECRET), "Bound")
    index = np.arange(table.num_rows)
    plain = draw_words(keyed_random.bind_users(source, table).rows(index, "user"), 3)
    coded = draw_words(keyed_random.bind_users(source, grouped).rows(index, "user"), 3)
    assert (plain == coded).all()
    with pytest.raises(ValueError, match="grouping code"):
        keyed_random.bind(source, grouped, user=["__user", "__user_lo"]).rows(index, "user")


def test_groups_and_shapes_never_share_a_key():
    """One identity in two groups, or as text and as words, draws unrelated words."""
    source = keyed_random.KeyedSource(SECRET)
    as_text = source.rows("S", [b"a"]).view.element_words(1)
    words = np.array([[1, 2]], dtype=np.uint64)
    as_user = source.rows("S", words).view.element_words(1)
    table = pa.table({"__user": words[:, 0], "__user_lo": words[:, 1], "w": ["a"]})
    bound = keyed_random.bind(keyed_random.StageSource(source, "S"), table,
                              user=["__user", "__user_lo"], other=["__user", "__user_lo"],
                              pair=["__user", "__user_lo", "w"], key=["w"])
    drawn = {g: int(bound.rows([0], g).element_words(1)[0]) for g in ("user", "other", "pair",
                                                                      "key")}
    assert drawn["user"] == int(as_user[0])
    assert len({int(as_text[0]), *drawn.values()}) == 5


def test_empty_selections_and_tables_draw_nothing():
    table = _users_table()
    source = keyed_random.StageSource(keyed_random.KeyedSource(SECRET), "Bound")
    bound = keyed_random.bind_users(source, table, ["word"])
    for group in ("user", "pair"):
        assert len(bound.rows(np.zeros(0, dtype=np.int64), group).element_words(0)) == 0
    empty = pa.table({"word": pa.array([], pa.string())})
    view = keyed_random.table_streams(keyed_random.KeyedSource(SECRET), None, "R", empty, ["word"])
    assert len(view) == 0
    assert len(keyed_random.KeyedSource(SECRET).rows("R", []).view) == 0


def test_the_report_names_the_construction():
    """An audit tells from the report which construction drew a release."""
    from thresher.pipelines.planning.plan import make_plan
    from thresher.pipelines.specs import spec as spec_mod
    import os
    spec = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs", "examples",
                        "quickstart.yaml")
    report = make_plan(spec_mod.load(spec)).report()
    assert report["randomness"]["construction"] == keyed_random.CONSTRUCTION == "aes256-cbcmac-v1"
