# ruff: noqa: E501  (the catalog rows are data, one code per line)
"""NVIDIA's XID catalog as data, and gpumeter's verdict on every code in it.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, the "Xids" sheet of
https://docs.nvidia.com/Xid-Catalog.xlsx): code, mnemonic, description, which GPUs it applies to
(A100, H100, B100, GB200), the immediate action ("Resolution Bucket (Immediate Action)") and the
driver branch from which the driver also reports its own recovery action for it ("Xid 154
linkage"). Volta and older GPUs have their own catalog (xid-errors/archive), not kept here.

Hand-kept: ``_ROWS`` is the Xids sheet, one code per line, copied from a stored copy of the page
(cited elsewhere as last updated 2026-09-09; the page itself shows no date) and checked against
NVIDIA's own machine-readable mapping in NVSentinel (``xiderrorsmapping.csv``, codes 1-162).
Codes 162-172 have no immediate action in the catalog; ``DECISIONS`` decides each of them. To
update: add or change rows, bump ``CATALOG_VERSION``, run tests/metering_agent/test_xid_catalog.py
(it walks every code), and list the changed verdicts in the commit.

gpumeter's verdict follows the immediate action (``ACTION_VERDICTS``): NVIDIA's "restart the
application" and "ignore" codes are the customer's (an event, billed); "reset the GPU", "reboot
the node" and "contact support" (and the workflows that end in one of them) fail the GPU until it
is seen repaired. ``DECISIONS`` overrides the action for the codes NVIDIA itself leaves open or
that the billing promise reads differently, each with its reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

CATALOG_SOURCE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
CATALOG_VERSION = "NVIDIA Xid Catalog of 2026-09-09 (codes 1-172)"
PRODUCTS = ("A100", "H100", "B100", "GB200")


class Action(StrEnum):
    """The catalog's "Resolution Bucket (Immediate Action)"."""

    RESTART_APP = "RESTART_APP"
    IGNORE = "IGNORE"
    RESET_GPU = "RESET_GPU"
    RESTART_BM = "RESTART_BM"  # reboot the node (bare metal)
    RESTART_VM = "RESTART_VM"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"
    UPDATE_SWFW = "UPDATE_SWFW"
    CHECK_UVM = "CHECK_UVM"  # reset the GPU if UVM/vGPU is used, else ignore
    XID_154 = "XID_154"  # follow the recovery action the driver reports
    WORKFLOW_XID_45 = "WORKFLOW_XID_45"  # solo: restart Fabric Manager; else follow the other XID
    WORKFLOW_XID_48 = "WORKFLOW_XID_48"  # reset the GPU (drain and reset with XID 63/64)
    WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"  # "a GPU reset or node reboot is needed"
    WORKFLOW_NVLINK5_ERR = "WORKFLOW_NVLINK5_ERR"  # decided by the message's sub-code
    NONE = ""  # the catalog gives no immediate action


class Verdict(StrEnum):
    """What an XID does to the GPU's state (and so to the bill)."""

    CUSTOMER = "customer"  # an event only: the GPU stays healthy and billed
    FAILED = "failed"  # failed (credited, fails over) until the GPU is seen repaired
    DEGRADED = "degraded"  # still computes: degraded until the GPU is seen repaired
    # The catalog's action depends on what NVML does not report (the message's sub-code): the
    # driver's own recovery action decides (read every second; reset or reboot fails the GPU).
    # Degraded meanwhile; failed if the agent cannot read the recovery action.
    DRIVER = "driver"


ACTION_VERDICTS: dict[Action, Verdict] = {
    Action.RESTART_APP: Verdict.CUSTOMER,
    Action.IGNORE: Verdict.CUSTOMER,
    Action.XID_154: Verdict.CUSTOMER,  # the recovery-action rule reads the action itself
    Action.WORKFLOW_XID_45: Verdict.CUSTOMER,  # see DECISIONS
    Action.RESET_GPU: Verdict.FAILED,
    Action.RESTART_BM: Verdict.FAILED,
    Action.RESTART_VM: Verdict.FAILED,
    Action.CONTACT_SUPPORT: Verdict.FAILED,
    Action.CHECK_MECHANICALS: Verdict.FAILED,
    Action.UPDATE_SWFW: Verdict.FAILED,
    Action.WORKFLOW_XID_48: Verdict.FAILED,
    Action.WORKFLOW_NVLINK_ERR: Verdict.FAILED,
    Action.WORKFLOW_NVLINK5_ERR: Verdict.DRIVER,
    Action.CHECK_UVM: Verdict.DRIVER,
}

# Codes whose verdict is not read off the action, and why.
DECISIONS: dict[int, tuple[Verdict, str]] = {
    45: (
        Verdict.CUSTOMER,
        "the driver tearing down the application (Ctrl-C, kill, or after another XID): with"
        " another XID that one decides; alone it is the customer's own abort",
    ),
    94: (
        Verdict.DEGRADED,
        "contained: only the process that hit the error dies (RESTART_APP), other work runs on;"
        " NVIDIA advises a GPU reset when convenient, so the GPU is degraded until it is reset",
    ),
    155: (
        Verdict.FAILED,
        "RESET_GPU, although the catalog says intentional link-down events raise it: a link"
        " taken down by the provider's own operations is still a link the customer lost",
    ),
    160: (
        Verdict.CUSTOMER,
        "the catalog says IGNORE; NVSentinel's mapping says RESTART_BM. The catalog is the"
        " source here: a retired channel is the driver containing one application's fault",
    ),
    **{
        code: (Verdict.CUSTOMER, "power smoothing state: no GPU reset needed, compute unaffected")
        for code in (162, 163, 164, 165)
    },
    **{
        code: (Verdict.DRIVER, "confidential-computing NVLink condition: no action published")
        for code in (166, 170)
    },
    167: (Verdict.FAILED, "a fatal PCIe timeout: the GPU is unreachable until reset"),
    168: (Verdict.FAILED, "the GPU boots with less memory than rented until a reboot"),
    169: (Verdict.FAILED, "a micro-controller halt, as XID 62 (RESET_GPU)"),
    171: (Verdict.FAILED, "detail of an XID 48 (uncorrectable DRAM error): as XID 48"),
    172: (Verdict.FAILED, "detail of an XID 48 (uncorrectable SRAM error): as XID 48"),
}

# Stable cause names for degrading codes (the service migrates on chosen causes).
CODE_CAUSES: dict[int, str] = {
    94: "contained_ecc",
    **dict.fromkeys((144, 145, 146, 147, 148, 149, 150, 166, 170), "nvlink_error"),
    159: "c2c_error",
}


@dataclass(frozen=True, slots=True)
class XidEntry:
    code: int
    mnemonic: str
    description: str  # NVIDIA's words, shown to customers
    applies_to: tuple[str, ...]  # of PRODUCTS
    action: Action
    recovery_action_since: str | None  # driver branch reporting its recovery action for it
    verdict: Verdict
    reason: str  # why this verdict: the action, or the decision

    @property
    def rule(self) -> str:
        """The classifier rule name: ``xid_79_gpu_has_fallen_off_the_bus``."""
        name = self.mnemonic.split(" / ")[0].removeprefix("ROBUST_CHANNEL_").lower()
        return f"xid_{self.code}_{re.sub(r'[^a-z0-9]+', '_', name).strip('_')}"

    @property
    def cause(self) -> str:
        """The stable cause name its evidence carries (the customer's codes carry none)."""
        return CODE_CAUSES.get(self.code, "xid_failure")


# code|mnemonic|description|applies to A100,H100,B100,GB200 (Y/N)|immediate action|driver
_ROWS = """
1|ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD|Unused|NNNN|CONTACT_SUPPORT|
2|ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD|Unused|NNNN|CONTACT_SUPPORT|
3|ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD|Unused|NNNN|CONTACT_SUPPORT|
4|ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY|Unused|NNNN|CONTACT_SUPPORT|
5|ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW|Unused|NNNN|CONTACT_SUPPORT|
6|ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR|Unused|NNNN|CONTACT_SUPPORT|
7|ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR|Unused|NNNN|CONTACT_SUPPORT|
8|ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT|GPU stopped processing|YYYY|RESTART_APP|
9|ROBUST_CHANNEL_GR_ERROR_INSTANCE|Unused|NNNN|CONTACT_SUPPORT|
10|ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP|Unused|NNNN|CONTACT_SUPPORT|
11|ROBUST_CHANNEL_GR_ERROR_MISSING_HW|Invalid or corrupted push buffer stream|YYYY|RESTART_APP|
12|ROBUST_CHANNEL_GR_ERROR_SW_METHOD|Unused|NNNN|CONTACT_SUPPORT|
13|ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY|Graphics Engine Exception|YYYY|RESTART_APP|
14|ROBUST_CHANNEL_FAKE_ERROR|Unused (fake or injected error from userspace)|YYYY|IGNORE|
15|ROBUST_CHANNEL_SCANLINE_TIMEOUT|Unused|NNNN|CONTACT_SUPPORT|
16|ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT|Unused|NNNN|CONTACT_SUPPORT|
17|ROBUST_CHANNEL_PARAMETER_ERROR|Unused|NNNN|CONTACT_SUPPORT|
18|ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR|Unused|NNNN|CONTACT_SUPPORT|
19|ROBUST_CHANNEL_DISP_MISSED_NOTIFIER|Unused|NNNN|CONTACT_SUPPORT|
20|ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD|Unused|NNNN|CONTACT_SUPPORT|
21|ROBUST_CHANNEL_ME_ERROR_SW_METHOD|Unused|NNNN|CONTACT_SUPPORT|
22|ROBUST_CHANNEL_VP_ERROR_SW_METHOD|Unused|NNNN|CONTACT_SUPPORT|
23|ROBUST_CHANNEL_RC_LOGGING_ENABLED|Unused|NNNN|CONTACT_SUPPORT|
24|ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT|Unused|NNNN|CONTACT_SUPPORT|
25|ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY|Invalid or illegal push buffer stream|YYYY|RESTART_APP|
26|ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT|Unused|NNNN|CONTACT_SUPPORT|
27|ROBUST_CHANNEL_VP_ERROR|Unused|NNNN|CONTACT_SUPPORT|
28|ROBUST_CHANNEL_VP2_ERROR|Unused|NNNN|CONTACT_SUPPORT|
29|ROBUST_CHANNEL_BSP_ERROR|Unused|NNNN|CONTACT_SUPPORT|
30|ROBUST_CHANNEL_BAD_ADDR_ACCESS|Unused|NNNN|CONTACT_SUPPORT|
31|ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT|GPU memory page fault|YYYY|RESTART_APP|
32|ROBUST_CHANNEL_PBDMA_ERROR|Invalid or corrupted push buffer stream|YYYY|RESTART_APP|
33|ROBUST_CHANNEL_SEC_ERROR|Unused|NNNN|CONTACT_SUPPORT|
34|ROBUST_CHANNEL_MSVLD_ERROR|Unused|NNNN|CONTACT_SUPPORT|
35|ROBUST_CHANNEL_MSPDEC_ERROR|Unused|NNNN|CONTACT_SUPPORT|
36|ROBUST_CHANNEL_MSPPP_ERROR|Unused|NNNN|CONTACT_SUPPORT|
37|ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD|Driver firmware error|YYYY|IGNORE|
38|ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT|Driver firmware error|YYYY|IGNORE|
39|ROBUST_CHANNEL_CE0_ERROR|Copy Engine Exception|YYYY|RESTART_APP|
40|ROBUST_CHANNEL_CE1_ERROR|Copy Engine Exception|YYYY|RESTART_APP|
41|ROBUST_CHANNEL_CE2_ERROR|Copy Engine Exception|YYYY|RESTART_APP|
42|ROBUST_CHANNEL_VIC_ERROR|Unused|NNNN|CONTACT_SUPPORT|
43|ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR|GPU stopped processing|YYYY|IGNORE|
44|ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW|Graphics Engine fault during context switch|YYYY|IGNORE|
45|ROBUST_CHANNEL_PREEMPTIVE_REMOVAL|Preemptive cleanup, due to previous errors - most likely to see when running multiple CUDA applications and hitting a DBE|YYYY|WORKFLOW_XID_45|
46|ROBUST_CHANNEL_GPU_TIMEOUT_ERROR|GPU stopped processing|YYYY|RESET_GPU|
47|ROBUST_CHANNEL_NVENC0_ERROR|Unused|NNNN|CONTACT_SUPPORT|
48|ROBUST_CHANNEL_GPU_ECC_DBE|Double Bit ECC Error|YYYY|WORKFLOW_XID_48|R565
49|SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY|Unused|NNNN|CONTACT_SUPPORT|
50|SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR|Unused|NNNN|CONTACT_SUPPORT|
51|SILENT_RUNNING_STRESS_TEST_FAILURE|Unused|NNNN|CONTACT_SUPPORT|
52|SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE|Unused|NNNN|CONTACT_SUPPORT|
53|SILENT_RUNNING_TEMP_REDUCED_CLOCKING|Unused|NNNN|CONTACT_SUPPORT|
54|SILENT_RUNNING_PWR_REDUCED_CLOCKING|Auxiliary power is not connected to the GPU board|YYYN|CHECK_MECHANICALS|
55|SILENT_RUNNING_TEMPERATURE_READ_ERROR|Unused|NNNN|CONTACT_SUPPORT|
56|DISPLAY_CHANNEL_EXCEPTION|Unused|NNNN|CONTACT_SUPPORT|
57|FB_LINK_TRAINING_FAILURE_ERROR|Unused|NNNN|CONTACT_SUPPORT|
58|FB_MEMORY_ERROR|Unused|NNNN|CONTACT_SUPPORT|
59|PMU_ERROR|Unused|NNNN|CONTACT_SUPPORT|
60|ROBUST_CHANNEL_SEC2_ERROR|Video processor exception|YYYY|RESTART_APP|
61|PMU_BREAKPOINT|Unused|NNNN|CONTACT_SUPPORT|
62|PMU_HALT_ERROR|Internal micro-controller halt (newer drivers)|YYYY|RESET_GPU|R565
63|INFOROM_DRAM_RETIREMENT_EVENT|GPU memory remapping event|YYYY|IGNORE|R565
64|INFOROM_DRAM_RETIREMENT_FAILURE|GPU memory remapping failure|YYYY|RESET_GPU|R565
65|ROBUST_CHANNEL_NVENC1_ERROR|Unused|NNNN|CONTACT_SUPPORT|
66|ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION|Illegal access by driver|YYYY|IGNORE|
67|ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION|Illegal access by driver|YYYY|IGNORE|
68|ROBUST_CHANNEL_NVDEC0_ERROR|NVDEC0 Exception|YYYY|RESTART_APP|
69|ROBUST_CHANNEL_GR_CLASS_ERROR|Graphics Engine class error|YYYY|RESTART_APP|
70|ROBUST_CHANNEL_CE3_ERROR|CE3: Unknown Error|YYYY|RESTART_APP|
71|ROBUST_CHANNEL_CE4_ERROR|CE4: Unknown Error|YYYY|RESTART_APP|
72|ROBUST_CHANNEL_CE5_ERROR|CE5: Unknown Error|YYYY|RESTART_APP|
73|ROBUST_CHANNEL_NVENC2_ERROR|Unused|NNNN|CONTACT_SUPPORT|
74|NVLINK_ERROR|NVLINK Error|YYNN|WORKFLOW_NVLINK_ERR|R565
75|ROBUST_CHANNEL_CE6_ERROR|CE6: Unknown Error|YYYY|RESTART_APP|
76|ROBUST_CHANNEL_CE7_ERROR|CE7: Unknown Error|YYYY|RESTART_APP|
77|ROBUST_CHANNEL_CE8_ERROR|CE8: Unknown Error|YYYY|RESTART_APP|
78|VGPU_START_ERROR|vGPU Start Error|YYYY|UPDATE_SWFW|
79|ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS|GPU has fallen off the bus|YYYY|RESTART_BM|R565
80|PBDMA_PUSHBUFFER_CRC_MISMATCH|Corrupted data sent to GPU|YYNN|RESTART_APP|
81|ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR|Unused|NNNN|CONTACT_SUPPORT|
82|ROBUST_CHANNEL_NVJPG0_ERROR|NVJPG0 Error|YYYY|RESTART_APP|
83|ROBUST_CHANNEL_NVDEC1_ERROR|NVDEC1 Error|YYYY|RESTART_APP|
84|ROBUST_CHANNEL_NVDEC2_ERROR|NVDEC2 Error|YYYY|RESTART_APP|
85|ROBUST_CHANNEL_CE9_ERROR|CE9: Unknown Error|YYYY|RESTART_APP|
86|ROBUST_CHANNEL_OFA0_ERROR|OFA Exception|YYYY|RESTART_APP|
87|NVTELEMETRY_DRIVER_REPORT|Unused|NNNN|CONTACT_SUPPORT|
88|ROBUST_CHANNEL_NVDEC3_ERROR|NVDEC3 Error|YYYY|RESTART_APP|
89|ROBUST_CHANNEL_NVDEC4_ERROR|NVDEC4 Error|YYYY|RESTART_APP|
90|LTC_ERROR|Unused|NNNN|CONTACT_SUPPORT|
91|RESERVED_XID|Unused|NNNN|CONTACT_SUPPORT|
92|EXCESSIVE_SBE_INTERRUPTS|High single-bit ECC error rate|YYYY|IGNORE|
93|INFOROM_ERASE_LIMIT_EXCEEDED|Non-fatal violation of provisioned InfoROM wear limit|YNNN|IGNORE|
94|ROBUST_CHANNEL_CONTAINED_ERROR|Contained memory error|YYYY|RESTART_APP|R565
95|ROBUST_CHANNEL_UNCONTAINED_ERROR|Uncontained memory error|YYYY|RESET_GPU|R565
96|ROBUST_CHANNEL_NVDEC5_ERROR|NVDEC5 Error|NYYY|RESTART_APP|
97|ROBUST_CHANNEL_NVDEC6_ERROR|NVDEC6 Error|NYYY|RESTART_APP|
98|ROBUST_CHANNEL_NVDEC7_ERROR|NVDEC7 Error|NYYY|RESTART_APP|
99|ROBUST_CHANNEL_NVJPG1_ERROR|NVJPG1 Error|NYYY|RESTART_APP|
100|ROBUST_CHANNEL_NVJPG2_ERROR|NVJPG2 Error|NYYY|RESTART_APP|
101|ROBUST_CHANNEL_NVJPG3_ERROR|NVJPG3 Error|NYYY|RESTART_APP|
102|ROBUST_CHANNEL_NVJPG4_ERROR|NVJPG4 Error|NYYY|RESTART_APP|
103|ROBUST_CHANNEL_NVJPG5_ERROR|NVJPG5 Error|NYYY|RESTART_APP|
104|ROBUST_CHANNEL_NVJPG6_ERROR|NVJPG6 Error|NYYY|RESTART_APP|
105|ROBUST_CHANNEL_NVJPG7_ERROR|NVJPG7 Error|NYYY|RESTART_APP|
106|SMBPBI_TEST_MESSAGE|SMBPBI Test Message|YYYY|IGNORE|
107|SMBPBI_TEST_MESSAGE_SILENT|SMBPBI Test Message Silent|YYYY|IGNORE|
108|NVLINK_REMOTE_TRANSLATION_ERROR|Unused|YYYY|IGNORE|
109|ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR|Context Switch Timeout Error|YYYY|RESET_GPU|R570
110|SEC_FAULT_ERROR|Security Fault Error|NYYY|RESET_GPU|R565
111|BUNDLE_ERROR_EVENT|Unused|NNNN|CONTACT_SUPPORT|
112|DISP_SUPERVISOR_ERROR|Unused|NNNN|CONTACT_SUPPORT|
113|DP_LT_FAILURE|Unused|NNNN|CONTACT_SUPPORT|
114|HEAD_RG_UNDERFLOW|Unused|NNNN|CONTACT_SUPPORT|
115|CORE_CHANNEL_REGS|Unused|NNNN|CONTACT_SUPPORT|
116|WINDOW_CHANNEL_REGS|Unused|NNNN|CONTACT_SUPPORT|
117|CURSOR_CHANNEL_REGS|Unused|NNNN|CONTACT_SUPPORT|
118|HEAD_REGS|Unused|NNNN|CONTACT_SUPPORT|
119|GSP_RPC_TIMEOUT|GSP RPC Timeout|YYYY|RESET_GPU|
120|GSP_ERROR|GSP Error|YYYY|RESET_GPU|R565
121|C2C_ERROR|C2C Error|NNNY|IGNORE|
122|SPI_PMU_RPC_READ_FAIL|Unused|NNNN|CONTACT_SUPPORT|
123|SPI_PMU_RPC_WRITE_FAIL|Unused|NNNN|CONTACT_SUPPORT|
124|SPI_PMU_RPC_ERASE_FAIL|Unused|NNNN|CONTACT_SUPPORT|
125|INFOROM_FS_ERROR|Unused|NNNN|CONTACT_SUPPORT|
126|ROBUST_CHANNEL_CE10_ERROR|CE10: Unknown Error|NNYY|RESTART_APP|
127|ROBUST_CHANNEL_CE11_ERROR|CE11: Unknown Error|NNYY|RESTART_APP|
128|ROBUST_CHANNEL_CE12_ERROR|CE12: Unknown Error|NNYY|RESTART_APP|
129|ROBUST_CHANNEL_CE13_ERROR|CE13: Unknown Error|NNYY|RESTART_APP|
130|ROBUST_CHANNEL_CE14_ERROR|CE14: Unknown Error|NNYY|RESTART_APP|
131|ROBUST_CHANNEL_CE15_ERROR|CE15: Unknown Error|NNYY|RESTART_APP|
132|ROBUST_CHANNEL_CE16_ERROR|CE16: Unknown Error|NNYY|RESTART_APP|
133|ROBUST_CHANNEL_CE17_ERROR|CE17: Unknown Error|NNYY|RESTART_APP|
134|ROBUST_CHANNEL_CE18_ERROR|CE18: Unknown Error|NNYY|RESTART_APP|
135|ROBUST_CHANNEL_CE19_ERROR|CE19: Unknown Error|NNYY|RESTART_APP|
136|ALI_TRAINING_FAIL|Link Training Failed|NYNN|RESET_GPU|R565
137|NVLINK_PRIV_ERR|NVLink Privilege Error|YYYY|IGNORE|
138|ROBUST_CHANNEL_DLA_ERROR|Unused|NNNN|CONTACT_SUPPORT|
139|ROBUST_CHANNEL_OFA1_ERROR|OFA1 Error|NNYY|RESTART_APP|
140|UNRECOVERABLE_ECC_ERROR_ESCAPE|ECC Unrecovered Error|YYYY|RESET_GPU|
141|ROBUST_CHANNEL_FAST_PATH_ERROR|CUDA Fast Path Error|NYYY|IGNORE|
142|ROBUST_CHANNEL_NVENC3_ERROR|NVENC3 Error|NNNY|CONTACT_SUPPORT|
143|GPU_INIT_ERROR|GPU Initialization Error|NYYY|RESET_GPU|R575
144|NVLINK_SAW_ERROR|NVLINK: SAW Error|NNYY|WORKFLOW_NVLINK5_ERR|R565
145|NVLINK_RLW_ERROR|NVLINK: RLW Error|NNYY|WORKFLOW_NVLINK5_ERR|R565
146|NVLINK_TLW_ERROR|NVLINK: TLW Error|NNYY|WORKFLOW_NVLINK5_ERR|R565
147|NVLINK_TREX_ERROR|NVLINK: TREX Error|NNYY|WORKFLOW_NVLINK5_ERR|R565
148|NVLINK_NVLPW_CTRL_ERROR|NVLINK: NVLPW_CTRL Error|NNYY|WORKFLOW_NVLINK5_ERR|R565
149|NVLINK_NETIR_ERROR|NVLINK: NETIR Error|NNYY|WORKFLOW_NVLINK5_ERR|R565
150|NVLINK_MSE_ERROR|NVLINK: MSE Error|NNYY|WORKFLOW_NVLINK5_ERR|R565
151|ROBUST_CHANNEL_KEY_ROTATION_ERROR|Key rotation Error|NYYY|RESTART_VM|
152|ROBUST_CHANNEL_DLA_SMMU_ERROR|DLA SMMU Error|NNNN|IGNORE|
153|ROBUST_CHANNEL_DLA_TIMEOUT|DLA timeout Error|NNNN|IGNORE|
154|GPU_RECOVERY_ACTION_CHANGED|GPU Recovery Action Changed|YYYY|XID_154|
155|NVLINK_SW_DEFINED_ERROR|NVLINK: SW Defined Error|NNYY|RESET_GPU|R565
156|RESOURCE_RETIREMENT_EVENT|Resource Retirement Event|NYYY|RESET_GPU|R565
157|RESOURCE_RETIREMENT_FAILURE|Resource Retirement Failure|NYYY|IGNORE|
158|GPU_FATAL_TIMEOUT|GPU Fatal Timeout|YYYY|RESET_GPU|
159|ROBUST_CHANNEL_CHI_NON_DATA_ERROR|CHI Non-Data Error|NNYY|CHECK_UVM|
160|CHANNEL_RETIREMENT_EVENT|Channel Retirement Event|NNYY|IGNORE|R575
161|CHANNEL_RETIREMENT_FAILURE|Channel Retirement Failure|NNYY|IGNORE|R575
162|PSHC_REENGAGED|Power Smoothing HW Circuitry capability reengaged|NNYY||
163|PSHC_DISENGAGED|Power Smoothing HW Circuitry capability disengaged|NNYY||
164|PSHC_LOW_LIFETIME|Power Smoothing HW Circuitry low lifetime reached|NNYY||
165|PSHC_ZERO_LIFETIME|Power Smoothing HW Circuitry lifetime exhausted|NNYY||
166|NVLINK_SECURE_CRYPTO_ERR|CC traffic seen prior to link properly being configured for encrypted traffic|NNYY||
167|PCIE_FATAL_TIMEOUT|PCIe fatal timeout|NYYY||
168|REDUCED_GPU_MEMORY_CAPACITY|Errors found in WPR (write protected region)|YYYY||
169|SEC2_HALT_ERROR|Internal micro-controller halt|NYYY||
170|NVLINK_SECURE_OTHER|Interrupt seen in CC mode|NNYY||
171|UNCORRECTABLE_DRAM_ERROR|Additional to Xid 48, giving the particulars of the fault (DRAM)|YYYY||
172|UNCORRECTABLE_SRAM_ERROR|Additional to Xid 48, giving the particulars of the fault (SRAM)|YYYY||
"""


def _entry(line: str) -> XidEntry:
    code, mnemonic, description, applies, action, driver = line.split("|")
    bucket = Action(action)
    verdict, reason = DECISIONS.get(
        int(code), (ACTION_VERDICTS.get(bucket), f"NVIDIA's immediate action: {action}")
    )
    assert verdict is not None, f"XID {code}: no verdict for action {action!r}"
    return XidEntry(
        int(code),
        mnemonic,
        description,
        tuple(p for p, flag in zip(PRODUCTS, applies, strict=True) if flag == "Y"),
        bucket,
        driver or None,
        verdict,
        reason,
    )


CATALOG: dict[int, XidEntry] = {
    entry.code: entry for entry in map(_entry, _ROWS.strip().splitlines())
}
