#!/usr/bin/python3
"""Generate tiny-bert, a small BERT-architecture text encoder for tests.

Usage: /usr/bin/python3 testdata/models/gen_tiny_bert.py OUTPUT_DIR

Writes into OUTPUT_DIR:
  model.onnx      a 2-layer BERT encoder (hidden 128, 4 heads, GELU FFN 512,
                  max 512 positions) with inputs input_ids, attention_mask,
                  token_type_ids (int64 [batch, sequence]) and output
                  last_hidden_state (float [batch, sequence, 128]), built from
                  standard ONNX ops at opset 17. Weights are random from a
                  fixed seed: the vectors are meaningless, the computation is
                  real (padding is masked out of attention like BERT does).
  tokenizer.json  a Hugging Face WordPiece tokenizer (BertNormalizer,
                  BertPreTokenizer, WordPiece, TemplateProcessing
                  "[CLS] $A [SEP]") over a vocabulary of special tokens,
                  characters, "##" pieces and the common English words below.
  manifest.json   the model store's manifest for onnx/tiny-bert/test-128.

Needs only onnx and numpy (Debian's python3-onnx and python3-numpy). The
output is byte-for-byte the same on every run.
"""

import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20240611
HIDDEN = 128
HEADS = 4
LAYERS = 2
FFN = 512
MAX_POSITIONS = 512
TYPE_VOCAB = 2
OPSET = 17

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# Common English words, most frequent first (roughly).
WORDS = """
the of and to a in is it you that he was for on are with as i his they be at
one have this from or had by not word but what some we can out other were all
there when up use your how said an each she which do their time if will way
about many then them write would like so these her long make thing see him two
has look more day could go come did number sound no most people my over know
water than call first who may down side been now find any new work part take
get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say
help low line differ turn cause much mean before move right boy old too same
tell does set three want air well also play small end put home read hand port
large spell add even land here must big high such follow act why ask men change
went light kind off need house picture try us again animal point mother world
near build self earth father head stand own page should country found answer
school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea
draw left late run while press close night real life few north open seem
together next white children begin got walk example ease paper group always
music those both mark often letter until mile river car feet care second book
carry took science eat room friend began idea fish mountain stop once base hear
horse cut sure watch color face wood main enough plain girl usual young ready
above ever red list though feel talk bird soon body dog family direct pose leave
song measure door product black short numeral class wind question happen
complete ship area half rock order fire south problem piece told knew pass
since top whole king space heard best hour better true during hundred five
remember step early hold west ground interest reach fast verb sing listen six
table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern
pull cold notice voice unit power town fine certain fly fall lead cry dark
machine note wait plan figure star box noun field rest correct able pound done
beauty drive stood contain front teach week final gave green oh quick develop
ocean warm free minute strong special mind behind clear tail produce fact
street inch multiply nothing course stay wheel full force blue object decide
surface deep moon island foot system busy test record boat common gold possible
plane stead dry wonder laugh thousand ago ran check game shape equate hot miss
brought heat snow tire bring yes distant fill east paint language among grand
ball yet wave drop heart am present heavy dance engine position arm wide sail
material size vary settle speak weight general ice matter circle pair include
divide syllable felt perhaps pick sudden count square reason length represent
art subject region energy hunt probable bed brother egg ride cell believe
fraction forest sit race window store summer train sleep prove lone leg
exercise wall catch mount wish sky board joy winter sat written wild instrument
kept glass grass cow job edge sign visit past soft fun bright gas weather month
million bear finish happy hope flower clothe strange gone jump baby eight
village meet root buy raise solve metal whether push seven paragraph third shall
held hair describe cook floor either result burn hill safe cat century consider
type law bit coast copy phrase silent tall sand soil roll temperature finger
industry value fight lie beat excite natural view sense ear else quite broke
case middle kill son lake moment scale loud spring observe child straight
consonant nation dictionary milk speed method organ pay age section dress cloud
surprise quiet stone tiny climb cool design poor lot experiment bottom key iron
single stick flat twenty skin smile crease hole trade melody trip office
receive row mouth exact symbol die least trouble shout except wrote seed tone
join suggest clean break lady yard rise bad blow oil blood touch grew cent mix
team wire cost lost brown wear garden equal sent choose fell fit flow fair bank
collect save control decimal gentle woman captain practice separate difficult
doctor please protect noon whose locate ring character insect caught period
indicate radio spoke atom human history effect electric expect crop modern
element hit student corner party supply bone rail imagine provide agree thus
capital chair danger fruit rich thick soldier process operate guess necessary
sharp wing create neighbor wash bat rather crowd corn compare poem string bell
depend meat rub tube famous dollar stream fear sight thin triangle planet hurry
chief colony clock mine tie enter major fresh search send yellow gun allow
print dead spot desert suit current lift rose continue block chart hat sell
success company subtract event particular deal swim term opposite wife shoe
shoulder spread arrange camp invent cotton born determine quart nine truck
noise level chance gather shop stretch throw shine property column molecule
select wrong gray repeat require broad prepare salt nose plural anger claim
continent oxygen sugar death pretty skill women season solution magnet silver
thank branch match suffix especially fig afraid huge sister steel discuss
forward similar guide experience score apple bought led pitch coat mass card
band rope slip win dream evening condition feed tool total basic smell valley
nor double seat arrive master track parent shore division sheet substance favor
connect post spend chord fat glad original share station dad bread charge
proper bar offer segment slave duck instant market degree populate chick dear
enemy reply drink occur support speech nature range steam motion path liquid
log meant quotient teeth shell neck computer network data model text image
search engine server client request response node mesh cluster service
inference vector embedding token language learning machine training memory
file folder window screen keyboard mouse phone email message internet website
online software hardware program code bug test build release version update
user account password login security privacy policy price cost budget quota
limit rate speed latency throughput batch queue worker thread process signal
health status ready error warning info debug trace metric log event time date
monday tuesday wednesday thursday friday saturday sunday january february march
april june july august september october november december today tomorrow
yesterday week weekend holiday coffee tea juice bread cheese butter rice pasta
pizza salad soup chicken beef pork fish egg fruit apple banana orange grape lemon
berry cake cookie chocolate candy sugar honey salt pepper kitchen table chair
bed sofa lamp desk shelf door window roof wall floor garden street road bridge
city village country state nation world europe asia africa america australia
english french german spanish chinese japanese russian italian arabic hindi
happy sad angry tired hungry thirsty sick healthy rich poor young old new fresh
clean dirty hot cold warm cool wet dry soft hard heavy light dark bright loud
quiet fast slow early late big small long short tall wide narrow thick thin
good bad better best worse worst great nice beautiful ugly pretty lovely cute
red orange yellow green blue purple pink brown black white gray grey gold
silver one two three four five six seven eight nine ten eleven twelve thirteen
fourteen fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty
sixty seventy eighty ninety hundred thousand million billion first second third
fourth fifth last next previous again always never sometimes often usually
rarely already still yet soon now then later before after during while until
since because although though unless whether however therefore moreover also
too very really quite rather almost nearly just only even especially actually
probably maybe perhaps certainly definitely exactly simply clearly together
apart away back forward inside outside above below under over across through
around along behind beside between beyond near far here there everywhere
somewhere nowhere anywhere something nothing anything everything someone
anyone everyone nobody somebody everybody myself yourself himself herself
itself ourselves themselves mine yours hers ours theirs this that these those
who whom whose which what where when why how is am are was were be been being
have has had having do does did doing done will would shall should can could
may might must ought need dare go goes went gone going come comes came coming
get gets got getting make makes made making take takes took taken taking see
sees saw seen seeing know knows knew known knowing think thinks thought
thinking say says said saying tell tells told telling give gives gave given
giving find finds found finding use uses used using work works worked working
call calls called calling try tries tried trying ask asks asked asking feel
feels felt feeling leave leaves left leaving put puts putting mean means meant
meaning keep keeps kept keeping let lets letting begin begins began begun
seem seems seemed help helps helped helping show shows showed shown hear hears
play plays played playing run runs running move moves moved moving live lives
lived living believe believes believed bring brings brought happen happens
happened write writes wrote written writing sit sits sat sitting stand stands
stood lose loses lost losing pay pays paid meet meets met include includes
included continue continues continued set sets learn learns learned change
changes changed lead leads led understand understands understood watch watches
watched follow follows followed stop stops stopped create creates created speak
speaks spoke spoken read reads reading spend spends spent grow grows grew grown
open opens opened walk walks walked win wins won offer offers offered remember
remembers remembered love loves loved consider considers considered appear
appears appeared buy buys bought wait waits waited serve serves served die dies
died send sends sent expect expects expected stay stays stayed fall falls fell
fallen cut cuts reach reaches reached kill kills killed remain remains remained
suggest suggests suggested raise raises raised pass passes passed sell sells
sold require requires required report reports reported decide decides decided
pull pulls pulled government company group problem fact hand part place case
week system program question government number night point home water room
mother area money story month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law
car city community name president team minute idea kid body information school
face others level office door health person art war history party result change
morning reason research girl guy moment air teacher force education foot boy age
policy everything process music market sense product effect class piece
development role student economy president society activity table rest record
paper space ground form event official matter center couple site project
activity star table need court oil situation cost industry figure street image
phone data picture practice piece land product doctor wall patient worker news
test movie north love support technology step baby computer type attention film
tree source organization hair window evidence population truth song fire camera
simple natural human ancient modern public private local national international
social political economic financial medical legal military cultural physical
mental environmental digital personal professional general specific common
special important different possible available similar major main central
serious recent current final full free huge large little low necessary only
open real significant single strong sure true whole wrong able ready due easy
hard likely nice okay fine various dear
""".split()

# Frequent word endings and inner pieces, used after the first piece of a word.
SUFFIXES = """
s es ed ing er ers est ly ion ions tion tions ment ments ness able ible ful less
al ial ic ical ity ty ive ous ious ize ise ized ated ate ates ation ations ant
ent ence ance ist ism ship hood ward wards y ry ary ory ery en ens ened ening le
les led ling th ths ish ian ians ese ine ure ures age ages al als ally ably ibly
ings ies ied ier iest lier liest aff able ular ular ology ologist graph phy
""".split()

# A few CJK ideographs and non-ASCII punctuation so BertNormalizer's CJK
# spacing and Unicode punctuation splitting meet real vocabulary entries.
EXTRA_CHARS = list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年") + list("¡¿«»–—‘’“”…•€£¥©®°±×÷")


def build_vocab():
    """Returns the vocabulary as an ordered list of unique tokens."""
    tokens = list(SPECIAL)
    tokens += [chr(c) for c in range(0x21, 0x7F) if not ("A" <= chr(c) <= "Z")]
    tokens += EXTRA_CHARS
    letters = "abcdefghijklmnopqrstuvwxyz"
    tokens += ["##" + c for c in letters + "0123456789"]
    tokens += ["##" + a + b for a in letters for b in letters]
    tokens += ["##" + s for s in SUFFIXES]
    tokens += [str(n) for n in range(10, 101)]
    tokens += WORDS
    seen = set()
    out = []
    for t in tokens:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def tokenizer_json(vocab):
    special_ids = {t: vocab.index(t) for t in SPECIAL}
    added = [
        {
            "id": special_ids[t],
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for t in SPECIAL
    ]

    def special(t, type_id):
        return {"SpecialToken": {"id": t, "type_id": type_id}}

    def seq(s, type_id):
        return {"Sequence": {"id": s, "type_id": type_id}}

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {
            "type": "BertNormalizer",
            "clean_text": True,
            "handle_chinese_chars": True,
            "strip_accents": None,
            "lowercase": True,
        },
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [special("[CLS]", 0), seq("A", 0), special("[SEP]", 0)],
            "pair": [special("[CLS]", 0), seq("A", 0), special("[SEP]", 0), seq("B", 1), special("[SEP]", 1)],
            "special_tokens": {
                t: {"id": t, "ids": [special_ids[t]], "tokens": [t]} for t in ("[CLS]", "[SEP]")
            },
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {
            "type": "WordPiece",
            "unk_token": "[UNK]",
            "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100,
            "vocab": {t: i for i, t in enumerate(vocab)},
        },
    }


class Graph:
    """Collects nodes and initializers with unique names."""

    def __init__(self, rng):
        self.rng = rng
        self.nodes = []
        self.inits = []
        self.n = 0

    def name(self, hint):
        self.n += 1
        return "%s_%d" % (hint, self.n)

    def const(self, hint, array):
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def weight(self, hint, shape, std):
        return self.const(hint, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def op(self, op_type, inputs, hint=None, **attrs):
        out = self.name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out + "_node", **attrs))
        return out

    def linear(self, x, fan_in, fan_out, hint):
        w = self.weight(hint + "_w", (fan_in, fan_out), 1.0 / np.sqrt(fan_in))
        b = self.weight(hint + "_b", (fan_out,), 0.02)
        return self.op("Add", [self.op("MatMul", [x, w]), b], hint)

    def layer_norm(self, x, hint):
        scale = self.const(hint + "_gamma", np.ones(HIDDEN, np.float32))
        bias = self.const(hint + "_beta", np.zeros(HIDDEN, np.float32))
        return self.op("LayerNormalization", [x, scale, bias], hint, axis=-1, epsilon=1e-12)


def build_model(vocab_size):
    rng = np.random.default_rng(SEED)
    g = Graph(rng)
    head_dim = HIDDEN // HEADS

    # Embeddings: word + position + token type, then LayerNorm.
    word = g.op("Gather", [g.weight("word_embeddings", (vocab_size, HIDDEN), 0.5), "input_ids"], "word_emb")
    shape = g.op("Shape", ["input_ids"])
    seq_len = g.op("Gather", [shape, g.const("one", np.array(1, np.int64))], "seq_len", axis=0)
    positions = g.op("Range", [g.const("zero", np.array(0, np.int64)), seq_len, g.const("step", np.array(1, np.int64))], "position_ids")
    pos = g.op("Gather", [g.weight("position_embeddings", (MAX_POSITIONS, HIDDEN), 0.5), positions], "pos_emb")
    typ = g.op("Gather", [g.weight("token_type_embeddings", (TYPE_VOCAB, HIDDEN), 0.5), "token_type_ids"], "type_emb")
    x = g.layer_norm(g.op("Add", [g.op("Add", [word, pos]), typ]), "emb_ln")

    # Additive attention mask: 0 for real tokens, -10000 for padding, [B,1,1,S].
    maskf = g.op("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    inv = g.op("Sub", [g.const("one_f", np.array(1.0, np.float32)), maskf], "mask_inv")
    bias = g.op("Mul", [inv, g.const("neg", np.array(-10000.0, np.float32))], "mask_bias")
    bias = g.op("Unsqueeze", [bias, g.const("axes", np.array([1, 2], np.int64))], "mask_4d")

    split_heads = g.const("split_heads", np.array([0, 0, HEADS, head_dim], np.int64))
    merge_heads = g.const("merge_heads", np.array([0, 0, HIDDEN], np.int64))
    scale = g.const("scale", np.array(1.0 / np.sqrt(head_dim), np.float32))
    for layer in range(LAYERS):
        p = "l%d" % layer

        def heads(t, perm):
            return g.op("Transpose", [g.op("Reshape", [t, split_heads])], perm=perm)

        q = heads(g.linear(x, HIDDEN, HIDDEN, p + "_q"), [0, 2, 1, 3])  # [B,H,S,D]
        k = heads(g.linear(x, HIDDEN, HIDDEN, p + "_k"), [0, 2, 3, 1])  # [B,H,D,S]
        v = heads(g.linear(x, HIDDEN, HIDDEN, p + "_v"), [0, 2, 1, 3])  # [B,H,S,D]
        scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), scale]), bias], p + "_scores")
        probs = g.op("Softmax", [scores], p + "_probs", axis=-1)
        ctx = g.op("Transpose", [g.op("MatMul", [probs, v])], p + "_ctx", perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", [ctx, merge_heads])
        attn = g.linear(ctx, HIDDEN, HIDDEN, p + "_o")
        x = g.layer_norm(g.op("Add", [attn, x]), p + "_attn_ln")

        # Feed-forward with exact GELU: 0.5 * h * (1 + erf(h / sqrt(2))).
        h = g.linear(x, HIDDEN, FFN, p + "_ffn_in")
        erf = g.op("Erf", [g.op("Div", [h, g.const("sqrt2", np.array(np.sqrt(2.0), np.float32))])])
        one = g.const("one_g", np.array(1.0, np.float32))
        half = g.const("half", np.array(0.5, np.float32))
        gelu = g.op("Mul", [g.op("Mul", [h, half]), g.op("Add", [erf, one])], p + "_gelu")
        out = g.linear(gelu, FFN, HIDDEN, p + "_ffn_out")
        x = g.layer_norm(g.op("Add", [out, x]), p + "_ffn_ln")

    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output_node"))
    dims = ["batch", "sequence"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, dims) for n in ("input_ids", "attention_mask", "token_type_ids")]
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, dims + [HIDDEN])]
    graph = helper.make_graph(g.nodes, "tiny_bert", inputs, outputs, g.inits)
    model = helper.make_model(graph, producer_name="infermesh gen_tiny_bert.py", opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# Model shapes: "tiny" is the fast default for tests; "minilm" has the
# architecture of all-MiniLM-L6-v2 (6 layers, hidden 384, 12 heads, FFN 1536),
# still with random weights, so benchmarks see the cost profile of a real
# small embedding model.
SHAPES = {
    "tiny": dict(HIDDEN=128, HEADS=4, LAYERS=2, FFN=512, id="onnx/tiny-bert/test-128", tag="test-128"),
    "minilm": dict(HIDDEN=384, HEADS=12, LAYERS=6, FFN=1536, id="onnx/tiny-bert/minilm-shape", tag="minilm-shape"),
}
SHAPE = "tiny"


def manifest():
    shape = SHAPES[SHAPE]
    return {
        "id": shape["id"],
        "name": "tiny-bert",
        "tag": shape["tag"],
        "task": "embeddings",
        "modalities": ["embeddings"],
        "license": "MIT",
        "source": "generated by testdata/models/gen_tiny_bert.py",
        "description": "Test-only %d-layer BERT-architecture encoder (hidden %d, %d heads) with random weights from a fixed seed and a small WordPiece vocabulary; its vectors are meaningless." % (LAYERS, HIDDEN, HEADS),
        "files": {"model": "model.onnx", "tokenizer": "tokenizer.json"},
        "options": {
            "pooling": "mean",
            "normalize": "true",
            "max_tokens": "512",
            "dimensions": str(HIDDEN),
            "truncatable_dimensions": "true",
        },
    }


def write(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def main():
    global SHAPE, HIDDEN, HEADS, LAYERS, FFN
    args = sys.argv[1:]
    if len(args) == 3 and args[1] == "--shape" and args[2] in SHAPES:
        SHAPE = args[2]
        args = args[:1]
    if len(args) != 1:
        sys.stderr.write("usage: gen_tiny_bert.py OUTPUT_DIR [--shape tiny|minilm]\n")
        return 2
    shape = SHAPES[SHAPE]
    HIDDEN, HEADS, LAYERS, FFN = shape["HIDDEN"], shape["HEADS"], shape["LAYERS"], shape["FFN"]
    out = args[0]
    os.makedirs(out, exist_ok=True)
    vocab = build_vocab()
    tok = json.dumps(tokenizer_json(vocab), indent=2, ensure_ascii=False) + "\n"
    write(os.path.join(out, "tokenizer.json"), tok.encode("utf-8"))
    write(os.path.join(out, "model.onnx"), build_model(len(vocab)).SerializeToString())
    # The manifest goes last: its presence means the other files are complete.
    write(os.path.join(out, "manifest.json"), (json.dumps(manifest(), indent=2) + "\n").encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
